-- ledger.lua: the usage ledger's row update, the Redis port of
-- src/domain/budget/ledger.rs and of the memory store's `enter`. Not a script
-- of its own: build.rs puts it in the prelude of reserve.lua and settle.lua.
--
-- ledger_add(base, at, hfield, dfield, d, hret, dret, now) adds the doubles `d`
-- (LEDGER_FIELDS of them, in the order of `Row`) to field `hfield` of the
-- hourly hash `<base>h:<hour of at>` and to field `dfield` of the daily hash
-- `<base>d:<UTC day of at>` (hours and days counted from the Unix epoch). A
-- field new to its hash gives the hash its expiry: the end of its hour (day)
-- plus hret (dret) µs — the same for every field of a hash; a row that would
-- live less than LEDGER_MIN_LIFE is past its retention and not written. Two
-- HGET and two HSET per call, and a PEXPIRE for a new row. The hour and day are the only
-- decimals a budget script formats: a key name must be readable.

local LEDGER_FMT = '<' .. string.rep('d', LEDGER_FIELDS)

local function ledger_row(key, field, d, expires, now)
  if expires - now < LEDGER_MIN_LIFE then return end
  local raw = redis.call('HGET', key, field)
  local r = d
  if raw then
    local old = {struct.unpack(LEDGER_FMT, raw)}
    r = {}
    for i = 1, LEDGER_FIELDS do r[i] = old[i] + d[i] end
  end
  redis.call('HSET', key, field, struct.pack(LEDGER_FMT, unpack(r, 1, LEDGER_FIELDS)))
  if not raw then
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
