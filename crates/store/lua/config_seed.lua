#!lua
-- config_seed.lua: seed the live configuration from a replica's file or built-in
-- defaults, but only when Redis holds no tier yet.
--
-- KEYS[1]  the configuration hash   KEYS[2] the audit stream
-- ARGV[1]  actor   ARGV[2] channel   ARGV[3] audit entries to keep
-- ARGV[4..] field, JSON document, field, JSON document, ...
--
-- Returns the version after seeding, or 0 when Redis already had tiers (nothing
-- written).

for _, field in ipairs(redis.call('HKEYS', KEYS[@[config_keys.hash]])) do
  if string.sub(field, 1, 5) == 'tier:' then return 0 end
end
for i = @[config_seed_argv], #ARGV, 2 do
  redis.call('HSET', KEYS[@[config_keys.hash]], ARGV[i], ARGV[i + 1])
end
local version = redis.call('HINCRBY', KEYS[@[config_keys.hash]], 'version', 1)
local t = redis.call('TIME')
redis.call('XADD', KEYS[@[config_keys.audit]], 'MAXLEN', '~', ARGV[@[config_seed_argv.audit_keep]], '*',
  'actor', ARGV[@[config_seed_argv.actor]], 'field', '*', 'old', '', 'new', 'seeded ' .. ((#ARGV - @{config_seed_argv}) / 2) .. ' documents',
  'version', version, 'at_ms', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('PUBLISH', ARGV[@[config_seed_argv.channel]], version)
return version
