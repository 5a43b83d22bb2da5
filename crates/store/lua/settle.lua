#!lua
--@prelude layout ledger state alerts
-- settle.lua: Commit (the real usage) or Refund (nothing used) one reservation.
-- The Redis port of crates/core/src/budget/settle.rs, held to it by
-- tests/store/differential/; state layout as in reserve.lua. build.rs prepends the
-- constants in capitals (crates/core/src/layout.rs), clock_us(), lua/ledger.lua
-- and lua/state.lua, and splices lua/splice/window_now.lua, bucket_level.lua and
-- bucket_crossings.lua.
--
-- KEYS[1..n]  level hashes of the reservation, outermost first (every level, limited or not)
-- KEYS[n+1]   reservation record
-- KEYS[n+2]   the estimator's samples (a list of doubles, newest first); absent on a
--             Redis Cluster, where the caller pushes the sample apart (another slot)
-- KEYS[n+3]   the completions' samples of the estimator key and tier (a list of
--             doubles, newest first), when ARGV[1] keeps any; absent on a cluster
-- ARGV[1]  spec: little-endian doubles
--          n, mode (1 commit, 2 refund), actual prompt tokens (commit),
--          samples kept (0: the prompt is no upstream count, no sample), cached
--          prompt tokens, hret and dret (ledger rows' retention past their hour
--          and day, µs; 0: no ledger), completions kept (0: no completion
--          sample), the prompt's cache-write tokens (5-minute, 1-hour) and the
--          completion's reasoning tokens (the ledger's parts) (calls.rs SETTLE);
--          then what the usage takes in each rate dimension by its code
--          (crates/core/src/dimension.rs; Usage::used: one request, its tokens, its
--          input — the prompt less what the model group does not count — its
--          completion, its cost in µ$, what it declared; all 0 for a refund);
--          then per level:
--          level bit, bucket count b, the overrun credit's capacity and refill
--          period (us; 0: none), the key's longest life past this write (us, as
--          in reserve.lua), then b times: id, limit (id as in reserve.lua;
--          a calendar window's three more doubles follow, as in reserve.lua)
-- ARGV[2]  lease field '#<nonce>'   ARGV[3] record retention (ms)   ARGV[4] owner tag (8 bytes)
-- ARGV[5]  '<' followed by at least as many 'd' as the longest state or spec
-- ARGV[6], ARGV[7], ARGV[8]  with the ledger on: the tenant's ledger key prefix, the
--          reservation's hourly and daily row fields (ledger.lua)
-- ARGV[9] (ARGV[6] with the ledger off)  when some bucket has alert thresholds:
--          their spec (alerts.lua)
--
-- Returns (the tags first: REPLY_APPLIED 1, REPLY_SETTLED_BEFORE 0, REPLY_NOT_FOUND -1,
-- from crates/core/src/layout.rs)
--   {1, amount, estimated, spend, granted, declared, [sample]}  applied: commit → actual - reserved;
--                           (a cluster's reply that queued an alert: the sample or
--                           false, then 'A<now>': alerts.lua)
--                           refund → tokens returned; the prompt tokens the service
--                           had estimated (0 when the caller counted); the spend
--                           reserved (µ$); the output tokens granted; the record's
--                           declared part ('' when none); the estimator
--                           sample's bytes when there is one and no samples' key
--   {0, state, amount}   already settled ('C' committed | 'F' refunded), its amount
--   {-1}                 no such reservation (never made, long gone, or id edited)
--
-- Settling moves every bucket by what the usage takes in its dimension less
-- what the reservation took (the record: cost, granted output, spend, its
-- declared part); Commit charges an overage even into debt and returns a
-- surplus without overfilling. Refund (a usage of 0) returns all of it. A record of the previous
-- layout (no granted output) reads as all prompt. A level that held the learned output
-- (the record's learned mask) moves by what it held, and gets the credit its
-- reservation took (grant - learned) back, never above its capacity (a credit no
-- longer stored is full already). Both free the lease, expired or not. A level left with no lease has
-- no earliest expiry (0); otherwise the stored expiry stays a lower bound (the
-- next reserve after it passes recomputes it; status.lua reads the real one).
-- Finding the next lease on every settle would cost an HGETALL: measured 3x the
-- instructions of a Commit. A commit of a prompt the service
-- counted adds a sample to the estimator's list (kept 30 days, trimmed and
-- renewed once in OUTPUT_TRIM_SLACK pushes: readers take the newest kept): the
-- actual prompt tokens and the prompt's mix (crates/core/src/mix.rs), or actual ÷
-- estimated for a record without a mix. Every level is read before
-- anything is written, so an error part-way changes nothing and a retry applies
-- once. A settled record is kept for ARGV[3] ms, so repeats answer
-- ALREADY_SETTLED and change nothing. A key's life is capped at 90 days however
-- deep its debt. With the ledger on, a settlement moves its reservation from
-- unsettled to committed (with the usage) or refunded in the rows of the hour it
-- was taken (crates/core/src/budget/ledger.rs); one taken outside the ledger enters whole.

local D = ARGV[@[settlement_argv.doubles]]
local spec = {struct.unpack(fmt_of(D, #ARGV[@[settlement_argv.spec]] / 8), ARGV[@[settlement_argv.spec]])}
local nlev = spec[@[settle.levels]]
-- Alert thresholds: the place of the next bucket that has some (0: none),
-- its entry at alert_at (as in reserve.lua).
local alert_spec, alert_at, alert_next, crossings = nil, 2, 0, nil
do
  local at = @[settlement_argv]
  if spec[@[settle.hourly_retention_us]] > 0 then at = @[settlement_argv] + @{ledger_argv} end
  if ARGV[at] then
    alert_spec = {struct.unpack(fmt_of(D, #ARGV[at] / 8), ARGV[at])}
    alert_spec[#alert_spec] = nil -- struct.unpack's last value is the next read position
    alert_next = alert_spec[2]
  end
end
local rkey = KEYS[nlev + @[settlement_keys.record]]
local rec = redis.call('GET', rkey)
if not rec then return {REPLY_NOT_FOUND} end
if string.sub(rec, REC_OWNER, REC_OWNER + 7) ~= ARGV[@[settlement_argv.owner]] then return {REPLY_NOT_FOUND} end
local state = string.sub(rec, 1, 1)
if state ~= RESERVED then return {REPLY_SETTLED_BEFORE, state, struct.unpack('<d', rec, REC_AMOUNT)} end

local now = clock_us()
local cost, exp = struct.unpack('<dd', rec, REC_COST)
local mask = string.byte(rec, REC_MASK)
local estimated = struct.unpack('<d', rec, REC_ESTIMATED)
local granted, spent, lat = 0, 0, 0
if #rec >= REC_LEN_V2 then granted, spent = struct.unpack('<dd', rec, REC_OUTPUT) end
if #rec >= REC_LEN then lat = struct.unpack('<d', rec, REC_LEDGER_AT) end
-- The record's optional parts after REC_LEN, from its length alone
-- (record.rs `parts`): the learned output (the levels holding it, and what
-- they hold), the declared part, the mix (always last).
local lmask, lout, lspend, mixed, dpart = 0, 0, 0, false, ''
local rest = #rec - REC_LEN
if rest > 0 then
  if rest >= MIX_BYTES then mixed, rest = true, rest - MIX_BYTES end
  if rest >= REC_LEARNED_BYTES then
    lmask, lout, lspend = struct.unpack('<Bdd', rec, REC_LEARNED_MASK)
    rest = rest - REC_LEARNED_BYTES
  end
  if rest > 0 then
    local at = REC_LEN + 1
    if lmask > 0 then at = at + REC_LEARNED_BYTES end
    dpart = string.sub(rec, at, at + rest - 1)
  end
end
-- What a reservation took in each dimension, by code, as the level at hand
-- holds it: one request, its c tokens (prompt + g output), the prompt's
-- input, g output, sp uUSD (Cost::reservation), and what it declared.
local reserved = {1, 0, 0, 0, 0, 0, 0, 0}
reserved[TOKENS], reserved[INPUT], reserved[OUTPUT], reserved[SPEND] = cost, cost - granted, granted, spent
if dpart ~= '' then
  local dv = {struct.unpack(fmt_of(D, #dpart / 8), dpart)}
  for k = 1, #dpart / 8 do reserved[DECLARED_FIRST + k - 1] = dv[k] end
end
-- What the usage takes, by code (all 0 for a refund): settling moves each
-- bucket by it less what was reserved.
local U = @[settle] - 1
local amount
if spec[@[settle.mode]] == 2 then
  amount, state = cost, REFUNDED
else
  amount, state = spec[U + TOKENS] - cost, COMMITTED
end
-- What settling moves a bucket of the level at hand by, from its id's dimension code.
local function delta(id)
  local kind = (id % GROUP - id % DIM) / DIM
  return spec[U + kind] - reserved[kind]
end

-- The credit a level holding the learned output gets back, from its stored
-- 'o' (nil when none is stored: a lapsed key's credit is full already).
local function given_back(o, cap, per)
  if not o then return nil end
  local c0, t = struct.unpack('<dd', o)
  local el = now - t
  if el < 0 then el = 0 end
  local c = c0 + el * cap / per
  if c > cap then c = cap end
  c = c + (granted - lout)
  if c > cap then c = cap end
  return struct.pack('<dd', c, now)
end

-- Read every level and compute its new state. The writes: 6 entries per
-- level written (key, holds, state, grow, expiry, credit), in one table sized
-- for three levels (a table per level, or one grown from {}, costs its
-- allocations: issue 27; a session's fourth level grows it once).
local writes, nw, p = {false, false, false, false, false, false, false, false, false,
  false, false, false, false, false, false, false, false, false}, 0, @[settle] + DIMS
local seen = 0 -- the buckets of earlier levels
for i = 1, nlev do
  local lbit, nb = spec[p + @{settle_level.bit}], spec[p + @{settle_level.buckets}]
  local cap = spec[p + @{settle_level.overrun_capacity}]
  local learned_here = lmask > 0 and bit.band(lmask, lbit) ~= 0
  if learned_here then
    local c = cost - granted + lout
    reserved[TOKENS], reserved[INPUT], reserved[OUTPUT], reserved[SPEND] = c, c - lout, lout, lspend
  end
  -- Its credit is read with its state (one call), or alone if the state is not.
  local credit_read = learned_here and cap > 0
  local credit
  local touched = false
  local q = p + @{settle_level}
  for b = 1, nb do
    local id = spec[q + @{bucket.id}]
    if delta(id) ~= 0 then touched = true end
    if id % DIM >= WINDOWS then q = q + @{bucket} else q = q + @{bucket.window_start} end
  end
  local after = q
  -- A live lease is certainly still there; a lapsed one may have been reclaimed.
  local holds = bit.band(mask, lbit) ~= 0
    and (exp > now or redis.call('HEXISTS', KEYS[i], ARGV[@[settlement_argv.lease]]) == 1)
  if not (touched or holds) and credit_read then
    credit = given_back(redis.call('HGET', KEYS[i], 'o'), cap, spec[p + @{settle_level.overrun_refill_us}])
    if credit then
      writes[nw + 1], writes[nw + 2], writes[nw + 3] = KEYS[i], false, false
      writes[nw + 4], writes[nw + 5], writes[nw + 6] = false, 0, credit
      nw = nw + 6
    end
  end
  if touched or holds then
    local raw
    if credit_read then
      local r = redis.call('HMGET', KEYS[i], 's', 'o')
      raw, credit = r[1], given_back(r[2], cap, spec[p + @{settle_level.overrun_refill_us}])
    else
      raw = redis.call('HGET', KEYS[i], 's')
    end
    local s
    if raw then
      s = {struct.unpack(fmt_of(D, #raw / 8), raw)}
      s[#s] = nil
      if s[4] ~= STATE_V then s = upgrade(s) end
    else
      s = {0, 0, 0, STATE_V}
    end
    if holds and s[1] > 0 then s[1] = s[1] - 1 end
    -- The last lease goes: no earliest expiry left.
    if holds and s[1] == 0 then s[2] = 0 end
    local ttl = 0
    q = p + @{settle_level}
    for b = 1, nb do
      local id, lim = spec[q + @{bucket.id}], spec[q + @{bucket.limit}]
      --@splice window_now
      local per = pd * 1e6
      local d = delta(id)
      if d ~= 0 then
        local k
        for j = FIRST_BUCKET, #s - 3, BUCKET_WIDTH do
          if s[j] == id then k = j break end
        end
        --@splice bucket_level
        -- This bucket's thresholds (a move down crosses none: the clamp
        -- below cannot matter).
        local c = d
        --@splice bucket_crossings
        l = l - d
        if d < 0 and l > lim then l = lim end
        s[k + 1], s[k + 2], s[k + 3] = l, now, lim
        local full
        if we > 0 then full = we - now else full = (lim - l) * per / lim end
        if full > ttl then ttl = full end
      end
    end
    if ttl > spec[p + @{settle_level.max_life_us}] then ttl = spec[p + @{settle_level.max_life_us}] end
    local grow = now + ttl > s[3]
    if grow then s[3] = now + 2 * ttl + TTL_SLACK end
    writes[nw + 1], writes[nw + 2], writes[nw + 3] = KEYS[i], holds, struct.pack(fmt_of(D, #s), unpack(s))
    writes[nw + 4], writes[nw + 5], writes[nw + 6] = grow, s[3], credit or false
    nw = nw + 6
  end
  if learned_here then
    reserved[TOKENS], reserved[INPUT], reserved[OUTPUT], reserved[SPEND] = cost, cost - granted, granted, spent
  end
  p = after
  seen = seen + nb
end

-- Write.
for w = 1, nw, 6 do
  local key, holds, raw, grow, x, credit = unpack(writes, w, w + 5)
  if holds then redis.call('HDEL', key, ARGV[@[settlement_argv.lease]]) end
  if raw and credit then redis.call('HSET', key, 's', raw, 'o', credit)
  elseif raw then redis.call('HSET', key, 's', raw)
  else redis.call('HSET', key, 'o', credit) end
  if grow then
    local ms = (x - now) / 1000
    redis.call('PEXPIRE', key, ms + (-ms) % 1)
  end
end
redis.call('SET', rkey, state .. string.sub(rec, REC_COST, REC_AMOUNT - 1)
  .. struct.pack('<d', amount) .. string.sub(rec, REC_ESTIMATED), 'PX', ARGV[@[settlement_argv.record_ttl_ms]])
local indexed = crossings and alerts_fire(KEYS, crossings, alert_spec[1], rkey, now)
-- The estimator sample: the actual and counted prompt tokens and the record's mix, or
-- (a record without one) actual / estimated. Without the samples' key (a
-- cluster) the reply carries it for the caller to push.
local sample
if state == COMMITTED and estimated > 0 and spec[@[settle.prompt]] > 0 and spec[@[settle.samples_kept]] > 0 then
  if mixed then
    sample = struct.pack('<I4I4', spec[@[settle.prompt]], estimated) .. string.sub(rec, -MIX_BYTES)
  else
    sample = struct.pack('<d', spec[@[settle.prompt]] / estimated)
  end
  local samples = KEYS[nlev + @[settlement_keys.estimator_samples]]
  if samples then
    -- Trimmed and renewed as the completions below: two calls in OUTPUT_TRIM_SLACK.
    local n = redis.call('LPUSH', samples, sample)
    if n == 1 or n > spec[@[settle.samples_kept]] + OUTPUT_TRIM_SLACK then
      redis.call('LTRIM', samples, 0, spec[@[settle.samples_kept]] - 1)
      redis.call('PEXPIRE', samples, SAMPLES_TTL_MS)
    end
    sample = nil
  end
end
-- The completion's sample, for a tier that learns its output.
local outs = KEYS[nlev + @[settlement_keys.output_samples]]
if state == COMMITTED and spec[@[settle.outputs_kept]] > 0 and outs then
  local n = redis.call('LPUSH', outs, struct.pack('<d', spec[U + OUTPUT]))
  -- Trimmed (readers take the newest kept) and its life renewed only when new
  -- or OUTPUT_TRIM_SLACK longer than kept: two calls in that many, not every time.
  if n == 1 or n > spec[@[settle.outputs_kept]] + OUTPUT_TRIM_SLACK then
    redis.call('LTRIM', outs, 0, spec[@[settle.outputs_kept]] - 1)
    redis.call('PEXPIRE', outs, SAMPLES_TTL_MS)
  end
end
if spec[@[settle.hourly_retention_us]] > 0 then
  local d = {0, 0, -1, 0, 0, 0, 0, 0, 0, 0}
  if lat == 0 then lat, d[3], d[4] = now, 0, cost end
  if state == COMMITTED then
    local pr = cost - granted
    local prompt, completion = spec[@[settle.prompt]], spec[U + OUTPUT]
    d[1], d[5], d[6], d[7], d[8] = 1, prompt, spec[@[settle.cached]], completion, spec[U + SPEND]
    d[9], d[10] = pr, math.abs(pr - prompt)
    local cw, cw1h, rs = spec[@[settle.cache_write]], spec[@[settle.cache_write_1h]], spec[@[settle.reasoning]]
    local parts = cw + cw1h + rs
    for k = DECLARED_FIRST, DIMS do parts = parts + spec[U + k] end
    if parts > 0 then
      local at = LEDGER_FIELDS
      d[at + 1], d[at + 2], d[at + 3] = cw, cw1h, rs
      at = at + LEDGER_PARTS - DECLARED_FIRST + 1
      for k = DECLARED_FIRST, DIMS do d[at + k] = spec[U + k] end
    end
  else
    d[2] = 1
  end
  ledger_add(ARGV[@[settlement_argv] + @{ledger_argv.prefix}], lat, ARGV[@[settlement_argv] + @{ledger_argv.hour_field}],
    ARGV[@[settlement_argv] + @{ledger_argv.day_field}], d, spec[@[settle.hourly_retention_us]], spec[@[settle.daily_retention_us]], now)
end
if indexed then return {REPLY_APPLIED, amount, estimated, spent, granted, dpart, sample or false, indexed} end
return {REPLY_APPLIED, amount, estimated, spent, granted, dpart, sample}
