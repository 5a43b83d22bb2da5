//! Key-for-key comparison of the memory store with the Redis database, and
//! key expiry on the test clock (see the parent module's doc for why this is
//! exact).

use ctxbudget::store::memory::{NEVER, Stored};
use redis::aio::MultiplexedConnection;
use std::collections::{BTreeMap, BTreeSet};

/// The Redis key the scripts read "now" from (outside the store's prefix).
pub(super) const CLOCK_KEY: &str = "diff:clock";

/// Sets the test clock in Redis and answers Redis's real time (ms) just
/// before the call that follows.
const SET_CLOCK: &str = r"
redis.call('SET', KEYS[1], ARGV[1])
local t = redis.call('TIME')
return t[1] * 1000 + math.floor(t[2] / 1000)";

/// Every key under the prefix: name, type, absolute expiry (ms of Redis's real
/// clock, -1: none) and value; then removes every expiry, so Redis never
/// expires a key by its own clock. First element: Redis's real time (ms).
const DUMP: &str = r"
local t = redis.call('TIME')
local out = {t[1] * 1000 + math.floor(t[2] / 1000)}
for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do
  local ty = redis.call('TYPE', k).ok
  local at = redis.call('PEXPIRETIME', k)
  local v = {}
  if ty == 'string' then v = {redis.call('GET', k)}
  elseif ty == 'hash' then v = redis.call('HGETALL', k)
  elseif ty == 'list' then v = redis.call('LRANGE', k, 0, -1)
  elseif ty == 'zset' then v = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end
  if at >= 0 then redis.call('PERSIST', k) end
  out[#out + 1] = {k, ty, at, v}
end
return out";

/// True for a session's key, its slots' included: `<prefix>{T}:s:<U>:<S>…`
/// (`store::keys`; `T` is base64url, so `}:s:` comes only there).
fn is_session(key: &str) -> bool {
    key.contains("}:s:")
}

/// The Redis side of the comparison, and what it knows about expiries.
pub(super) struct Db {
    conn: MultiplexedConnection,
    set_clock: redis::Script,
    dump: redis::Script,
    prefix: String,
    /// Every key's expiry on the test clock (µs), as the memory store had it
    /// when Redis last set the key's TTL.
    expiries: BTreeMap<String, i64>,
}

fn hex(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if s.chars().all(|c| c.is_ascii_graphic()) => format!("{s:?}"),
        _ => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// A value, readable: strings as text or hex, doubles decoded.
pub(super) fn show(v: &Stored) -> String {
    let doubles = |b: &[u8]| -> String {
        let ds: Vec<String> = b
            .chunks(8)
            .map(|c| match <[u8; 8]>::try_from(c) {
                Ok(a) => f64::from_le_bytes(a).to_string(),
                Err(_) => hex(c),
            })
            .collect();
        format!("[{}]", ds.join(", "))
    };
    match v {
        Stored::String(b) => hex(b),
        Stored::Hash(m) => m
            .iter()
            .map(|(f, b)| format!("{f}={}", doubles(b)))
            .collect::<Vec<_>>()
            .join(" "),
        Stored::List(items) => items
            .iter()
            .map(|b| doubles(b))
            .collect::<Vec<_>>()
            .join(" "),
        Stored::ZSet(members) => members
            .iter()
            .map(|(m, score)| format!("{m}@{score}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

impl Db {
    pub(super) async fn connect(url: &str, prefix: &str) -> Self {
        let conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis");
        Db {
            conn,
            set_clock: redis::Script::new(SET_CLOCK),
            dump: redis::Script::new(DUMP),
            prefix: prefix.to_owned(),
            expiries: BTreeMap::new(),
        }
    }

    /// Empties the database for a new run.
    pub(super) async fn reset(&mut self) {
        redis::cmd("FLUSHDB")
            .query_async::<()>(&mut self.conn)
            .await
            .unwrap();
        self.expiries.clear();
    }

    /// Writes `now_us` to the clock key; Redis's real time (ms) just before.
    pub(super) async fn set_clock(&mut self, now_us: i64) -> i64 {
        self.set_clock
            .key(CLOCK_KEY)
            .arg(now_us)
            .invoke_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// Key and lease expiries (µs) a run may want to land on.
    pub(super) fn expiries(&self, memory: &BTreeMap<String, (Stored, i64)>) -> Vec<i64> {
        let mut out: Vec<i64> = self.expiries.values().copied().collect();
        for (v, _) in memory.values() {
            if let Stored::Hash(fields) = v {
                out.extend(
                    fields
                        .iter()
                        .filter(|(f, _)| f.starts_with('#'))
                        .filter_map(|(_, b)| <[u8; 8]>::try_from(b.as_slice()).ok())
                        .map(|a| f64::from_le_bytes(a) as i64),
                );
            }
        }
        // In a fixed order, so a seed replays the same run.
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The clock moved to `now_us`: deletes in Redis exactly the keys whose
    /// expiry has passed (`expiry <= now`, as both stores read it). True when
    /// a session's key was among them.
    pub(super) async fn expire(&mut self, now_us: i64) -> bool {
        let due: Vec<String> = self
            .expiries
            .iter()
            .filter(|(_, e)| **e <= now_us)
            .map(|(k, _)| k.clone())
            .collect();
        if !due.is_empty() {
            redis::cmd("DEL")
                .arg(&due)
                .query_async::<()>(&mut self.conn)
                .await
                .unwrap();
        }
        self.expiries.retain(|_, e| *e > now_us);
        due.iter().any(|k| is_session(k))
    }

    /// Compares every key with `memory` (its values byte for byte; a TTL Redis
    /// set since the last check against the memory expiry, given Redis ran the
    /// call after real time `t0_ms`), then removes Redis's TTLs.
    pub(super) async fn compare(
        &mut self,
        memory: &BTreeMap<String, (Stored, i64)>,
        now_us: i64,
        t0_ms: i64,
    ) -> Result<(), String> {
        let raw: Vec<redis::Value> = self
            .dump
            .arg(&self.prefix)
            .invoke_async(&mut self.conn)
            .await
            .unwrap();
        let mut items = raw.into_iter();
        let t1_ms: i64 = redis::from_redis_value(items.next().unwrap()).unwrap();
        let mut redis_keys = BTreeMap::new();
        for item in items {
            let (k, ty, at, v): (String, String, i64, Vec<Vec<u8>>) =
                redis::from_redis_value(item).unwrap();
            let stored = match ty.as_str() {
                "string" => Stored::String(v.into_iter().next().unwrap_or_default()),
                "hash" => Stored::Hash(
                    v.chunks(2)
                        .map(|p| (String::from_utf8(p[0].clone()).unwrap(), p[1].clone()))
                        .collect(),
                ),
                "list" => Stored::List(v),
                "zset" => Stored::ZSet(
                    v.chunks(2)
                        .map(|p| {
                            let score = String::from_utf8_lossy(&p[1]).parse().unwrap();
                            (String::from_utf8(p[0].clone()).unwrap(), score)
                        })
                        .collect(),
                ),

                other => return Err(format!("{k}: unexpected Redis type {other}")),
            };
            redis_keys.insert(k, (stored, at));
        }
        let names: BTreeSet<&String> = memory.keys().chain(redis_keys.keys()).collect();
        let mut errors = Vec::new();
        for k in names {
            match (memory.get(k), redis_keys.get(k)) {
                (Some((m, _)), Some((r, _))) if m != r => errors.push(format!(
                    "{k}: values differ\n    memory {}\n    redis  {}",
                    show(m),
                    show(r)
                )),
                (Some((_, exp)), Some((_, at))) => {
                    if let Err(e) = self.check_expiry(k, *exp, *at, now_us, (t0_ms, t1_ms)) {
                        errors.push(e);
                    }
                }
                (Some((m, _)), None) => errors.push(format!("{k}: only in memory: {}", show(m))),
                (None, Some((r, _))) => errors.push(format!("{k}: only in Redis: {}", show(r))),
                (None, None) => unreachable!(),
            }
        }
        self.expiries.retain(|k, _| memory.contains_key(k));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\n  "))
        }
    }

    /// `at`: the absolute expiry (ms, Redis's clock) Redis set during the call,
    /// or -1 when the call set none. The scripts set `ceil((expiry - now) / 1000)`
    /// ms from Redis's time of the call, which lies within `[t0, t1]`.
    fn check_expiry(
        &mut self,
        k: &str,
        exp: i64,
        at: i64,
        now_us: i64,
        (t0, t1): (i64, i64),
    ) -> Result<(), String> {
        if at < 0 && exp == NEVER {
            return Ok(());
        }
        if at < 0 {
            return match self.expiries.get(k) {
                Some(&e) if e == exp => Ok(()),
                Some(&e) => Err(format!(
                    "{k}: memory moved its expiry from {e} to {exp} µs; Redis kept its TTL"
                )),
                None => Err(format!("{k}: a Redis key without a TTL")),
            };
        }
        let left_ms = (exp - now_us) as f64 / 1000.0;
        let set_at = at as f64 - left_ms;
        // 1 ms either side: Redis rounds its times to whole ms.
        if set_at < (t0 - 1) as f64 || set_at > (t1 + 2) as f64 {
            return Err(format!(
                "{k}: Redis TTL ends at {at} ms (real), memory's in {left_ms} ms: set at \
                 {set_at}, outside the call's [{t0}, {t1}]"
            ));
        }
        self.expiries.insert(k.to_owned(), exp);
        Ok(())
    }
}
