//! The global level's sync on a Redis Cluster (`lua/global_lease.lua`): what
//! a replica gives back, owes and leases, and the slot messages it posts and
//! reads — KEYS and ARGV from the shares' asks, the reply as grants.
//!
//! The asks and grants are the script's contract, so they are defined here,
//! beside their encoding; the cluster's share
//! ([`crate::store::cluster::share`]) fills in the asks and takes in the
//! grants.

use super::RedisStore;
use super::wire::{Args, DOUBLES, Spec, int_at, state_at};
use crate::domain::BucketSpec;
use crate::domain::budget::state::LevelState;
use crate::store::StoreError;
use redis::Value;

/// How long (ms) a slot message waits for its replica to read it.
const MESSAGE_KEEP_MS: u64 = 60_000;

/// One bucket of a sync: what to lease, what to give back.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketAsk {
    /// The bucket.
    pub spec: BucketSpec,
    /// How much to lease.
    pub want: f64,
    /// Given back (positive) or owed as debt (negative).
    pub give: f64,
}

/// One global entry of a sync.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryAsk {
    /// The entry's buckets.
    pub buckets: Vec<BucketAsk>,
    /// The concurrency limit; `None`: no slots.
    pub concurrency: Option<u64>,
    /// Slots to lease.
    pub want_slots: f64,
    /// Slots to give back.
    pub give_slots: f64,
    /// Until when (µs) Redis counts this replica's slots.
    pub slots_until: f64,
}

/// What the global key answered for one entry.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryGrant {
    /// Its state after the call.
    pub state: Option<LevelState>,
    /// Per bucket of the ask: what was leased.
    pub granted: Vec<f64>,
    /// What the key counts for this replica now.
    pub slots_mine: f64,
    /// What it counts for every replica.
    pub slots_in_use: f64,
}

/// One sync: the entries' keys and asks, and the messages.
pub struct LeaseCall<'a> {
    /// The global entries' keys, one per ask.
    pub keys: &'a [String],
    /// What each entry asks.
    pub asks: &'a [EntryAsk],
    /// This replica's slots field.
    pub replica: &'a str,
    /// Messages to post: lease field, new expiry (µs; 0: settled).
    pub posts: &'a [(String, f64)],
    /// Messages this replica matched, to delete: field, and the value read
    /// (a message posted again since is kept).
    pub deletes: &'a [(String, Vec<u8>)],
    /// Read the messages.
    pub read: bool,
}

/// What the global key answered.
#[derive(Debug)]
pub struct LeaseReply {
    /// The store's time (µs).
    pub now: f64,
    /// One per ask.
    pub grants: Vec<EntryGrant>,
    /// Every message: lease field, new expiry (µs; 0: settled), its value.
    pub messages: Vec<(String, f64, Vec<u8>)>,
}

impl RedisStore {
    /// Runs one sync with the global level.
    pub async fn lease_call(&self, call: &LeaseCall<'_>) -> Result<LeaseReply, StoreError> {
        let mut inv = self.global_lease.prepare_invoke();
        let mut args = Args::new(&mut inv);
        // KEYS: each entry's hash, then the slot messages' (calls.rs `lease_keys`).
        for (i, key) in call.keys.iter().enumerate() {
            args.key(i, key.clone()); // a sync per chunk, not per request
        }
        let n = call.keys.len();
        args.key(
            n + super::spec::lease_keys::MESSAGES,
            self.keys.global_messages(),
        );
        use super::spec::{lease as h, lease_bucket as lb, lease_entry as e};
        let mut head = [0.0; h::WIDTH];
        head[h::ENTRIES] = call.asks.len() as f64;
        let mut spec = Spec::default();
        spec.group(&head);
        for ask in call.asks {
            let mut entry = [0.0; e::WIDTH];
            entry[e::BUCKETS] = ask.buckets.len() as f64;
            entry[e::CONCURRENCY] = ask.concurrency.map_or(-1.0, |c| c as f64);
            entry[e::WANT_SLOTS] = ask.want_slots;
            entry[e::GIVE_SLOTS] = ask.give_slots;
            entry[e::SLOTS_UNTIL] = ask.slots_until;
            spec.group(&entry);
            for b in &ask.buckets {
                let mut wants = [0.0; lb::WIDTH];
                wants[lb::WANT] = b.want;
                wants[lb::GIVE] = b.give;
                spec.bucket(&b.spec).group(&wants);
            }
        }
        use super::spec::lease_argv as a;
        args.at(a::SPEC, &spec.0)
            .at(a::REPLICA, call.replica)
            .at(a::DOUBLES, DOUBLES)
            .at(a::MESSAGE_KEEP_MS, MESSAGE_KEEP_MS)
            .at(a::READ, if call.read { "1" } else { "0" })
            .at(a::POSTS, call.posts.len())
            .at(a::DELETES, call.deletes.len());
        // Then a pair per message to post, and per message to delete.
        for (i, (field, exp)) in call.posts.iter().enumerate() {
            let at = a::WIDTH + 2 * i;
            args.at(at, field.as_str())
                .at(at + 1, exp.to_le_bytes().as_slice());
        }
        for (i, (field, value)) in call.deletes.iter().enumerate() {
            let at = a::WIDTH + 2 * (call.posts.len() + i);
            args.at(at, field.as_str()).at(at + 1, value.as_slice());
        }
        let reply = self.run(&inv).await?;
        decode_lease(call.asks, &reply)
    }
}

/// global_lease.lua's reply: the time, the grants, the states, the messages.
#[expect(
    clippy::too_many_lines,
    reason = "decodes the reply's fields in wire order"
)]
fn decode_lease(asks: &[EntryAsk], reply: &[Value]) -> Result<LeaseReply, StoreError> {
    use super::spec::{lease_reply as h, reserve_reply_level as l};
    let now = int_at(reply, h::NOW)? as f64;
    let packed = match reply.get(h::GRANTS) {
        Some(Value::BulkString(b)) => b.as_slice(),
        _ => &[],
    };
    let grants: Vec<f64> = packed
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    let expected: usize = asks
        .iter()
        .map(|a| a.buckets.len() + if a.concurrency.is_some() { 2 } else { 0 })
        .sum();
    if grants.len() != expected || reply.len() < h::WIDTH + asks.len() * l::WIDTH {
        return Err(StoreError::Protocol(
            format!(
                "global_lease.lua answered {} grants and {} values for {} asks (is the script \
                 out of step with this binary?)",
                grants.len(),
                reply.len(),
                asks.len()
            )
            .into(),
        ));
    }
    let mut at = 0;
    let mut out = Vec::with_capacity(asks.len());
    for (i, ask) in asks.iter().enumerate() {
        let granted = grants[at..at + ask.buckets.len()].to_vec();
        at += ask.buckets.len();
        let (mine, in_use) = match ask.concurrency {
            Some(_) => {
                at += 2;
                (grants[at - 2], grants[at - 1])
            }
            None => (0.0, 0.0),
        };
        out.push(EntryGrant {
            state: state_at(reply, h::WIDTH + i * l::WIDTH + l::STATE)?,
            granted,
            slots_mine: mine,
            slots_in_use: in_use,
        });
    }
    let mut messages = Vec::new();
    let mut j = h::WIDTH + asks.len() * l::WIDTH;
    while j + 1 < reply.len() {
        let (Value::BulkString(field), Value::BulkString(value)) = (&reply[j], &reply[j + 1])
        else {
            return Err(StoreError::Protocol(
                "global_lease.lua answered a message that is not two strings".into(),
            ));
        };
        let exp = value
            .get(..8)
            .map_or(0.0, |b| f64::from_le_bytes(b.try_into().expect("8 bytes")));
        messages.push((
            String::from_utf8_lossy(field).into_owned(),
            exp,
            value.clone(),
        ));
        j += 2;
    }
    Ok(LeaseReply {
        now,
        grants: out,
        messages,
    })
}
