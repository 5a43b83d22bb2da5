-- output_room: lowers `room` to the output tokens that the bucket of `kind`,
-- at level `l` under the limit `lim`, leaves room for: what it holds beyond
-- the floor of the request's `headroom`, past the `prompt` in a token bucket,
-- all of it in an output bucket, what it pays for at the output price in a
-- spend bucket (whole uUSD; free output is not bounded). The Rust definition
-- is `BucketSpec::output_room` and `SpendRates::output_within` (crates/core/src/).
-- A level that `holds` less than the max (the learned output) bounds the
-- grant only below what it holds (crates/core/src/budget/reserve.rs).
-- build.rs splices this file where a script says `--@splice output_room`.
local above = l - headroom * lim
local fits = room
if kind == TOKENS then fits = above - prompt
elseif kind == OUTPUT then fits = above
elseif kind == SPEND and output_price > 0 then
  fits = math.floor((math.floor(above) * 1e6 - prompt_spend) / output_price)
end
if fits < room and fits < holds then room = fits end
