#!lua
-- config_set.lua: change one document of the live configuration, version it,
-- audit it and tell every replica. Used by `ctxbudget tiers|global|overrides`
-- and the admin API (crates/server/src/admin/).
--
-- KEYS[1]  the configuration hash: 'version', 'global', 'tier:<name>', 'override:<tenant>', ...
--          and beside each document the version of its last change (ARGV[7])
-- KEYS[2]  the audit stream
-- ARGV[1]  field   ARGV[2] new JSON document ('' deletes the field)
-- ARGV[3]  actor   ARGV[4] channel to publish the new version on
-- ARGV[5]  audit entries to keep (approximately)
-- ARGV[6]  '' or a configuration version the writer read the document at: the
--          write is refused if the document changed after it
-- ARGV[7]  the field holding the version of the document's last change
--
-- Returns {old document ('' if none), new version, version of the document's
-- last change, the configuration's version before}. A refused write returns
-- {old, 0, that version, the configuration's version} and changes nothing:
-- refused when the document changed after ARGV[6], or when ARGV[6] is a
-- version the configuration never reached. The caller validated the document; the write, the version bump,
-- the audit entry and the notification happen together or not at all.

local hash, field, document = KEYS[@[config_keys.hash]], ARGV[@[config_set_argv.field]], ARGV[@[config_set_argv.document]]
local read_at = ARGV[@[config_set_argv.read_at]]
local old = redis.call('HGET', hash, field) or ''
local changed_field = ARGV[@[config_set_argv.changed_field]]
local changed = tonumber(redis.call('HGET', hash, changed_field) or '0')
local current = tonumber(redis.call('HGET', hash, 'version') or '0')
if read_at ~= '' and (changed > tonumber(read_at) or tonumber(read_at) > current) then
  return {old, 0, changed, current}
end
if document == '' then
  redis.call('HDEL', hash, field)
else
  redis.call('HSET', hash, field, document)
end
local version = redis.call('HINCRBY', hash, 'version', 1)
redis.call('HSET', hash, changed_field, version)
local t = redis.call('TIME')
redis.call('XADD', KEYS[@[config_keys.audit]], 'MAXLEN', '~', ARGV[@[config_set_argv.audit_keep]], '*',
  'actor', ARGV[@[config_set_argv.actor]], 'field', field, 'old', old, 'new', document,
  'version', version, 'at_ms', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('PUBLISH', ARGV[@[config_set_argv.channel]], version)
return {old, version, version, current}
