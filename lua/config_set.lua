#!lua
-- config_set.lua: change one document of the live configuration, version it,
-- audit it and tell every replica. Used by `ctxbudget tiers|global|overrides`.
--
-- KEYS[1]  the configuration hash: 'version', 'global', 'tier:<name>', 'override:<tenant>'
-- KEYS[2]  the audit stream
-- ARGV[1]  field   ARGV[2] new JSON document ('' deletes the field)
-- ARGV[3]  actor   ARGV[4] channel to publish the new version on
-- ARGV[5]  audit entries to keep (approximately)
--
-- Returns {old document ('' if none), new version}. The caller validated the
-- document; the write, the version bump, the audit entry and the notification
-- happen together or not at all.

local old = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
local t = redis.call('TIME')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*',
  'actor', ARGV[3], 'field', ARGV[1], 'old', old, 'new', ARGV[2],
  'version', version, 'at_ms', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('PUBLISH', ARGV[4], version)
return {old, version}
