-- denied.lua: a denied reservation's (or charge's) mask with no check
-- denied yet: DENIED_DOUBLES doubles of 32 bits each (the Rust side is
-- DeniedChecks, crates/core/src/checks.rs), made at the first denial only.
-- Not a script of its own: build.rs puts it in the prelude of reserve.lua
-- and charge.lua.
local function denied_words()
  local m = {}
  for d = 1, DENIED_DOUBLES do m[d] = 0 end
  return m
end
