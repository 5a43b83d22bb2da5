-- ledger.lua: the usage ledger's row update, the Redis port of
-- crates/core/src/budget/ledger.rs and of the memory store's `enter`. Not a script
-- of its own: build.rs puts it in the prelude of reserve.lua and settle.lua.
--
-- ledger_add(base, at, hfield, dfield, d, hret, dret, now) adds the doubles `d`
-- (LEDGER_FIELDS of them, in the order of `Row`, or the parts too: cache
-- writes, reasoning tokens and each declared dimension's use) to field `hfield` of the
-- hourly hash `<base>h:<hour of at>` and to field `dfield` of the daily hash
-- `<base>d:<UTC day of at>` (hours and days counted from the Unix epoch). A
-- field new to its hash gives the hash its expiry: the end of its hour (day)
-- plus hret (dret) µs — the same for every field of a hash; a row that would
-- live less than LEDGER_MIN_LIFE is past its retention and not written. Two
-- HGET and two HSET per call, and a PEXPIRE for a new row. The hour and day are the only
-- decimals a budget script formats: a key name must be readable.

-- Little-endian 6-byte integers (exact below 2^47): a 60-byte row keeps a hash
-- in Redis's compact listpack encoding (values up to 64 bytes by default); 80
-- bytes of doubles cost twice the memory. A row with parts (78 bytes) is
-- written only for a tenant whose calls report them.
local LEDGER_FMT = '<' .. string.rep('i6', LEDGER_FIELDS)
-- The named parts, then one per declared dimension (crates/core/src/dimension.rs).
local LEDGER_LONG = LEDGER_FIELDS + LEDGER_PARTS + DIMS - DECLARED_FIRST + 1
local LEDGER_LONG_FMT = '<' .. string.rep('i6', LEDGER_LONG)
local LEDGER_BYTES = LEDGER_FIELDS * 6

-- Spelled out for LEDGER_FIELDS = 10: a loop over a table of the old values
-- cost twice the Redis CPU (measured: 1.9 against 0.8 us per row). A row with
-- parts, rarer, takes the loop.
local function ledger_row(key, field, d, expires, now)
  if expires - now < LEDGER_MIN_LIFE then return end
  local raw = redis.call('HGET', key, field)
  if raw and #d == LEDGER_FIELDS and #raw == LEDGER_BYTES then
    local a1, a2, a3, a4, a5, a6, a7, a8, a9, a10 = struct.unpack(LEDGER_FMT, raw)
    redis.call('HSET', key, field, struct.pack(LEDGER_FMT, a1 + d[1], a2 + d[2], a3 + d[3],
      a4 + d[4], a5 + d[5], a6 + d[6], a7 + d[7], a8 + d[8], a9 + d[9], a10 + d[10]))
  elseif raw then
    local a = {struct.unpack(string.sub(LEDGER_LONG_FMT, 1, 1 + #raw / 3), raw)}
    for i = 1, LEDGER_LONG do
      local old = 0
      if i * 6 <= #raw then old = a[i] end
      a[i] = old + (d[i] or 0)
    end
    redis.call('HSET', key, field, struct.pack(LEDGER_LONG_FMT, unpack(a, 1, LEDGER_LONG)))
  else
    local fmt = LEDGER_FMT
    if #d > LEDGER_FIELDS then fmt = LEDGER_LONG_FMT end
    redis.call('HSET', key, field, struct.pack(fmt, unpack(d, 1, #d)))
    local ms = (expires - now) / 1000
    redis.call('PEXPIRE', key, ms + (-ms) % 1)
  end
end

local function ledger_add(base, at, hfield, dfield, d, hret, dret, now)
  local hour = (at - at % HOUR_US) / HOUR_US
  local day = (at - at % DAY_US) / DAY_US
  ledger_row(base .. 'h:' .. string.format('%d', hour), hfield, d, (hour + 1) * HOUR_US + hret, now)
  ledger_row(base .. 'd:' .. string.format('%d', day), dfield, d, (day + 1) * DAY_US + dret, now)
end
