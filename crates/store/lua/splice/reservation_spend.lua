-- reservation_spend: what the prompt and the `grant`ed output cost, uUSD,
-- rounded up once, into a new local `spend`: the prompt at the input price
-- (`prompt_spend`, tokens x uUSD per million) and the output at
-- `output_price`. The Rust definition is `SpendRates::spend`
-- (crates/core/src/price.rs). build.rs splices this file where a script says
-- `--@splice reservation_spend`.
local spend = math.ceil((prompt_spend + grant * output_price) / 1e6)
