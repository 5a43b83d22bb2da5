-- bucket_level: the level now of the bucket `id` (limit `lim`, period digits
-- `pd`, as window_now leaves them) found at `k`
-- in state `s` (nil: not stored yet), into a new local `l`; a bucket not
-- stored yet is appended full (its place in `k`). A calendar window (we > 0)
-- does not refill and is full again once it starts at `ws`; a rolling bucket
-- refills since it was stored, never above its limit; a level stored under
-- another limit first moves by the difference (what was used is kept, use
-- beyond a lowered limit stays owed: BucketSpec::rebase). The Rust definition is
-- `LevelState::read_bucket` and `BucketSpec::level_now` (crates/core/src/).
-- build.rs splices this file where a script says `--@splice bucket_level`,
-- inline: a function call per bucket cost 1.8% more Redis instructions.
local l = lim
if k then
  l = s[k + 1]
  if s[k + 3] ~= lim and s[k + 3] > 0 then l = l + (lim - s[k + 3]) end
  if we > 0 then
    if s[k + 2] < ws then l = lim end
  else
    local el = now - s[k + 2]
    if el < 0 then el = 0 end
    l = l + el * lim / (pd * 1e6)
    if l > lim then l = lim end
  end
else
  k = #s + 1
  s[k], s[k + 1], s[k + 2], s[k + 3] = id, lim, now, lim
end
