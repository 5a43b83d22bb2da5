-- state.lua: reading a level's state, shared by the scripts that read one
-- (reserve.lua, settle.lua, renew.lua, charge.lua, global_lease.lua); build.rs
-- prepends it to them. The Rust side is LevelState::decode (the format shim).

-- The struct format of n doubles: a slice of D (the caller's '<ddd…'), or
-- built when a state outgrows it (a level crowded with other configurations'
-- buckets).
local function fmt_of(D, n)
  if n < #D then return string.sub(D, 1, n + 1) end
  return '<' .. string.rep('d', n)
end

-- s in the current format: a state written before buckets kept their limit
-- (no STATE_V in s[4]: HEAD_V1 doubles, then WIDTH_V1 per bucket) gets each
-- bucket's limit as 0, unknown (its level is taken as stored under the limit
-- of the day).
local function upgrade(s)
  local u = {s[1], s[2], s[3], STATE_V}
  for j = HEAD_V1 + 1, #s - WIDTH_V1 + 1, WIDTH_V1 do
    u[#u + 1], u[#u + 2], u[#u + 3], u[#u + 4] = s[j], s[j + 1], s[j + 2], 0
  end
  return u
end
