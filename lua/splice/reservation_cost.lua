-- reservation_cost: what a reservation of `prompt` tokens, `held` output
-- tokens and `held_spend` uUSD (what its level holds: the grant, or the
-- learned output) takes from a bucket of `kind`, into a new local `c`:
-- 1 from a request bucket. The Rust definition is `Cost::reservation` and
-- `Cost::of` (src/domain/bucket.rs). build.rs splices this file where a
-- script says `--@splice reservation_cost`.
local c = 1
if kind == TOKENS then c = prompt + held
elseif kind == INPUT then c = prompt
elseif kind == OUTPUT then c = held
elseif kind == SPEND then c = held_spend end
