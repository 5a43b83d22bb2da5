-- level.lua: writing a level's state, shared by the scripts that write one
-- (reserve.lua, charge.lua, global_lease.lua); build.rs prepends it to them. The Rust side is
-- StoredLevel::store and drop_foreign (crates/core/src/budget/).

-- s, keeping the buckets touched now (this call's, or another's this instant)
-- and of the others only the MAX_FOREIGN most recently used; nb: this call's.
local function trim_foreign(s, nb, now)
  if (#s - FIRST_BUCKET + 1) / BUCKET_WIDTH - nb <= MAX_FOREIGN then return s end
  local ts = {}
  for j = FIRST_BUCKET, #s - 3, BUCKET_WIDTH do
    if s[j + 2] ~= now then ts[#ts + 1] = s[j + 2] end
  end
  -- Trim only when more than MAX_FOREIGN were touched before now.
  if #ts <= MAX_FOREIGN then return s end
  table.sort(ts, function(a, b) return a > b end)
  local cutoff, kept = ts[MAX_FOREIGN], {s[1], s[2], s[3], s[4]}
  for j = FIRST_BUCKET, #s - 3, BUCKET_WIDTH do
    if s[j + 2] == now or s[j + 2] >= cutoff then
      kept[#kept + 1], kept[#kept + 2], kept[#kept + 3], kept[#kept + 4] = s[j], s[j + 1], s[j + 2], s[j + 3]
    end
  end
  return kept
end

-- Writes state s to the level hash key (with the field lease = expiry when
-- given, and the overrun credit 'o' = credit when given), growing the key's life when it must outlive ttl (us, capped at
-- MAX_TTL) to twice that plus TTL_SLACK. fmt: the struct format for s's
-- length, if it has it (else one is cut from D). Returns the packed state.
local function write_level(key, s, ttl, fmt, D, now, lease, expiry, credit)
  if ttl > MAX_TTL then ttl = MAX_TTL end
  local grow = now + ttl > s[3]
  if grow then s[3] = now + 2 * ttl + TTL_SLACK end
  if #s ~= #fmt - 1 then fmt = fmt_of(D, #s) end
  local raw = struct.pack(fmt, unpack(s))
  if expiry and credit then
    redis.call('HSET', key, 's', raw, lease, expiry, 'o', credit)
  elseif expiry then
    redis.call('HSET', key, 's', raw, lease, expiry)
  elseif credit then
    redis.call('HSET', key, 's', raw, 'o', credit)
  else
    redis.call('HSET', key, 's', raw)
  end
  if grow then
    local ms = (s[3] - now) / 1000
    redis.call('PEXPIRE', key, ms + (-ms) % 1)
  end
  return raw
end
