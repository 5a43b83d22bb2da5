-- window_now: for the bucket `id` whose spec starts at `q` (id, limit, and
-- for a calendar window its start, end and next end), new locals `ws`, `we`:
-- the window's start and end now (the next once a boundary passed; 0, 0 for a
-- rolling bucket), `pd` the id's period digits (the period in seconds of a
-- rolling bucket), and `q` moved past the bucket's spec. The Rust definition
-- is `Span::at` (crates/core/src/window.rs).
-- build.rs splices this file where a script says `--@splice window_now`.
local ws, we, pd = 0, 0, id % DIM
if pd >= WINDOWS then
  ws, we = spec[q + @{bucket.window_start}], spec[q + @{bucket.window_end}]
  if now >= we then ws, we = we, spec[q + @{bucket.window_next_end}] end
  q = q + @{bucket}
else
  q = q + @{bucket.window_start}
end
