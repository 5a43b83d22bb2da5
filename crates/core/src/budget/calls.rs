//! The numbers each script call carries, declared once by name: the doubles
//! of a script's spec (its `ARGV[1]`), in groups — a call's head, then what
//! repeats per level and per bucket — and the values of its reply. Nothing
//! else says where a number sits.
//!
//! `build.rs` generates from this list both sides of every call:
//! - for Rust, a module per group (`crate::store::redis::spec`) of index
//!   constants named after the fields and its `WIDTH`, by which the encoders
//!   in `crates/store/src/store/redis/` place each number;
//! - for Lua, the positions a script reads, written by name: `@{GROUP.field}`
//!   is the field's offset in its group (`spec[p + @{reserve_level.bit}]`; a
//!   `+ ` before an offset of 0 goes with it, so `spec[p]` costs no addition),
//!   `@{GROUP}` the group's width, `@[GROUP.field]` a head field's 1-based
//!   index (`spec[@[reserve.prompt]]`) and `@[GROUP]` the index after the
//!   head. The built script holds plain numbers, as if written by hand.
//!
//! Moving or adding a field here moves it in the encoder and the script
//! together.
//!
//! Size: every call's layout in one list, so that one file answers "where
//! does this number sit" for all of them. This file is compiled twice — as part of the crate and inside
//! `build.rs` — so it holds plain data and one pure function, and imports
//! nothing.

/// One group of a spec: its name (the Lua and Rust name) and its fields.
pub struct Group {
    /// The group's name.
    pub name: &'static str,
    /// Its fields, in the order they travel.
    pub fields: &'static [&'static str],
}

/// reserve.lua's head: the plan's numbers. Then the reservation's cost
/// vector, a double per rate dimension by its code (`Dimension::code`:
/// `spec[@[reserve] - 1 + code]`), with no output granted yet — reserve.lua
/// puts each level's held output and spend in it — then the levels.
pub const RESERVE: Group = Group {
    name: "reserve",
    fields: &[
        // How many levels follow.
        "levels",
        "prompt",
        "max_output",
        "min_output",
        "lease_ttl_us",
        // 0: the caller counted the prompt.
        "estimated",
        // The share of every limit to leave, 0 <= headroom < 1.
        "headroom",
        // The prompt at the input price (tokens × µ$ per million).
        "prompt_spend",
        // µ$ per million output tokens.
        "output_price",
        // How long ledger rows are kept past their hour and day (µs; 0: no ledger).
        "hourly_retention_us",
        "daily_retention_us",
        // 0: none (every level holds the grant).
        "learned_output",
    ],
};

/// reserve.lua, per level: then that many [`BUCKET`]s.
pub const RESERVE_LEVEL: Group = Group {
    name: "reserve_level",
    fields: &[
        "buckets",
        // -1: none.
        "concurrency",
        // What one reclaimed lease adds to the packed count (0: not counted here).
        "reclaim_weight",
        // The overrun credit (capacity 0: the level holds the grant).
        "overrun_capacity",
        "overrun_refill_us",
        // The level's bit in the lease mask.
        "bit",
        // The longest the level's key may live past this write (µs).
        "max_life_us",
    ],
};

/// settle.lua's head: the usage and what to keep of it. Then what the
/// usage takes in each rate dimension, by code (`Usage::used`; all 0 for a
/// refund), then the levels.
pub const SETTLE: Group = Group {
    name: "settle",
    fields: &[
        // How many levels follow.
        "levels",
        // 1: commit, 2: refund.
        "mode",
        "prompt",
        // Estimator samples kept (0: the prompt is no upstream count: no sample).
        "samples_kept",
        "cached",
        // How long ledger rows are kept past their hour and day (µs; 0: no ledger).
        "hourly_retention_us",
        "daily_retention_us",
        // Completions kept (0: no completion sample).
        "outputs_kept",
        "cache_write",
        "cache_write_1h",
        "reasoning",
    ],
};

/// settle.lua, per level: then that many [`BUCKET`]s.
pub const SETTLE_LEVEL: Group = Group {
    name: "settle_level",
    fields: &[
        // The level's bit in the lease mask.
        "bit",
        "buckets",
        // The overrun credit (capacity 0: none).
        "overrun_capacity",
        "overrun_refill_us",
        // The longest the level's key may live past this write (µs).
        "max_life_us",
    ],
};

/// charge.lua's head: what Envoy's rate limit call takes, with no
/// reservation behind it. Then its cost vector, a double per rate dimension
/// by code, then the levels.
pub const CHARGE: Group = Group {
    name: "charge",
    fields: &[
        // How many levels follow.
        "levels",
        // 1: a denial takes nothing (the request path); 0: charged into debt.
        "enforce",
    ],
};

/// charge.lua, per level: then that many [`BUCKET`]s.
pub const CHARGE_LEVEL: Group = Group {
    name: "charge_level",
    fields: &["buckets", "max_life_us"],
};

/// renew.lua's head: then one level bit per level.
pub const RENEW: Group = Group {
    name: "renew",
    fields: &["levels", "lease_ttl_us"],
};

/// status.lua's head: then one concurrency limit (-1: none) per level.
pub const STATUS: Group = Group {
    name: "status",
    fields: &["levels"],
};

/// global_lease.lua's head: then that many [`LEASE_ENTRY`]s.
pub const LEASE: Group = Group {
    name: "lease",
    fields: &["entries"],
};

/// global_lease.lua, per entry (a global level, or a model group's slots):
/// then that many [`BUCKET`]s, each followed by a [`LEASE_BUCKET`].
pub const LEASE_ENTRY: Group = Group {
    name: "lease_entry",
    fields: &[
        "buckets",
        // -1: none.
        "concurrency",
        "want_slots",
        "give_slots",
        // When the slots held lapse (µs).
        "slots_until",
    ],
};

/// global_lease.lua, after each bucket: what the replica asks for and gives
/// back of it.
pub const LEASE_BUCKET: Group = Group {
    name: "lease_bucket",
    fields: &["want", "give"],
};

/// One bucket of a level, in every script that checks or charges buckets:
/// its id and limit; a calendar window's bucket also its window's start, end
/// and the end of the next (a rolling bucket stops before `window_start`).
pub const BUCKET: Group = Group {
    name: "bucket",
    fields: &[
        "id",
        "limit",
        "window_start",
        "window_end",
        "window_next_end",
    ],
};

// Arguments: where each of a script's ARGV sits (ARGV[1] is the spec). A
// script's ARGV is its head, then what its header says follows.

/// reserve.lua's ARGV: then one level state's struct format per level, with
/// the ledger on a [`LEDGER_ARGV`], with alert thresholds their spec, and
/// last the tenant's record key prefix (`ARGV[#ARGV]`).
pub const RESERVE_ARGV: Group = Group {
    name: "reserve_argv",
    fields: &[
        "spec",
        // The lease field, '#<nonce>'.
        "lease",
        "record_ttl_ms",
        // '0': no idempotency key.
        "idempotency_ttl_ms",
        // The record's tail (and the prompt's mix).
        "record_tail",
        // The struct format of the spec.
        "spec_format",
    ],
};

/// settle.lua's and renew.lua's ARGV: then, for settle, with the ledger on a
/// [`LEDGER_ARGV`], and with alert thresholds their spec.
pub const SETTLEMENT_ARGV: Group = Group {
    name: "settlement_argv",
    fields: &[
        "spec",
        // The lease field, '#<nonce>'.
        "lease",
        "record_ttl_ms",
        // The reservation's owner tag (8 bytes).
        "owner",
        // '<' and enough 'd's for any state or spec.
        "doubles",
    ],
};

/// charge.lua's ARGV: then one level state's struct format per level, and
/// with alert thresholds their spec and the tenant's record key prefix.
pub const CHARGE_ARGV: Group = Group {
    name: "charge_argv",
    fields: &[
        "spec",
        // '<' and enough 'd's for any state or spec.
        "doubles",
        // The struct format of the spec.
        "spec_format",
    ],
};

/// status.lua's ARGV.
pub const STATUS_ARGV: Group = Group {
    name: "status_argv",
    fields: &[
        "spec",    // '<' and enough 'd's for any state or spec.
        "doubles", // '1': a level of at most EXACT_LEASES leases is read whole.
        "exact",
    ],
};

/// global_lease.lua's ARGV: then the messages to post (lease field, expiry)
/// and to delete (lease field, value), a pair each.
pub const LEASE_ARGV: Group = Group {
    name: "lease_argv",
    fields: &[
        "spec",
        // This replica's slots field ('c' and its id).
        "replica",
        // '<' and enough 'd's for any state or spec.
        "doubles",
        // How long (ms) a message is kept for its replica to read.
        "message_keep_ms",
        // '1': read the messages.
        "read",
        "posts",
        "deletes",
    ],
};

/// The ledger's arguments of a script that writes it (crates/store/lua/ledger.lua).
pub const LEDGER_ARGV: Group = Group {
    name: "ledger_argv",
    fields: &[
        // The tenant's ledger key prefix.
        "prefix",
        // The reservation's hourly and daily row fields.
        "hour_field",
        "day_field",
    ],
};

// Keys: where each key after a call's level keys sits (KEYS[1..n] are the
// levels' hashes, outermost first).

/// reserve.lua's KEYS after the levels (the idempotency entry only with a
/// key).
pub const RESERVE_KEYS: Group = Group {
    name: "reserve_keys",
    fields: &["record", "idempotency"],
};

/// settle.lua's and renew.lua's KEYS after the levels (renew takes the
/// record alone; settle the samples' lists when it keeps any, and not on a
/// cluster, where they are pushed apart).
pub const SETTLEMENT_KEYS: Group = Group {
    name: "settlement_keys",
    fields: &["record", "estimator_samples", "output_samples"],
};

// Replies: where each value of a script's reply sits, read by the decoders
// in `crates/store/src/store/redis/` (the scripts build their replies in this order).
// A reply of levels is its head, one group per level, then the tail of its
// tag.

/// reserve.lua's reply (allowed, denied or replayed): then one
/// [`RESERVE_REPLY_LEVEL`] per level, the tag's tail, and, when non-zero,
/// the reclaimed leases (packed).
pub const RESERVE_REPLY: Group = Group {
    name: "reserve_reply",
    fields: &["tag", "now", "granted_output"],
};

/// reserve.lua's reply, per level.
pub const RESERVE_REPLY_LEVEL: Group = Group {
    name: "reserve_reply_level",
    fields: &["state"],
};

/// reserve.lua's allowed tail.
pub const RESERVE_ALLOWED: Group = Group {
    name: "reserve_allowed",
    fields: &["reserved_output"],
};

/// reserve.lua's denied tail: the denied checks.
pub const RESERVE_DENIED: Group = Group {
    name: "reserve_denied",
    fields: &["checks"],
};

/// reserve.lua's replayed tail: the earlier reservation.
pub const RESERVE_REPLAYED: Group = Group {
    name: "reserve_replayed",
    fields: &["nonce", "tokens", "lease_left_ms"],
};

/// reserve.lua's reply for an idempotency key already spent.
pub const RESERVE_SPENT: Group = Group {
    name: "reserve_spent",
    fields: &["tag", "record_state"],
};

/// reserve_first.lua's reply: then each tried candidate's reserve reply.
pub const RESERVE_FIRST_REPLY: Group = Group {
    name: "reserve_first_reply",
    fields: &["chosen"],
};

/// settle.lua's reply when applied (on a cluster the sample to push, and
/// when an alert was queued its index mark, follow).
pub const SETTLE_APPLIED: Group = Group {
    name: "settle_applied",
    fields: &[
        "tag",
        "amount",
        "estimated_prompt_tokens",
        "reserved_spend",
        "reserved_output",
        // The record's declared part (little-endian doubles; '' when none).
        "reserved_declared",
        "sample",
    ],
};

/// settle.lua's reply for a reservation settled before.
pub const SETTLE_BEFORE: Group = Group {
    name: "settle_before",
    fields: &["tag", "record_state", "amount"],
};

/// renew.lua's reply when applied.
pub const RENEW_APPLIED: Group = Group {
    name: "renew_applied",
    fields: &["tag", "lease_left_ms"],
};

/// charge.lua's reply: then one state per level ([`RESERVE_REPLY_LEVEL`]'s
/// layout), and when denied the [`RESERVE_DENIED`] tail.
pub const CHARGE_REPLY: Group = Group {
    name: "charge_reply",
    fields: &["tag", "now"],
};

/// status.lua's reply: then one [`STATUS_REPLY_LEVEL`] per level.
pub const STATUS_REPLY: Group = Group {
    name: "status_reply",
    fields: &["now"],
};

/// status.lua's reply, per level.
pub const STATUS_REPLY_LEVEL: Group = Group {
    name: "status_reply_level",
    fields: &["state", "leases", "earliest_expiry"],
};

/// global_lease.lua's reply: then one state per entry, then the messages
/// (field, value pairs).
pub const LEASE_REPLY: Group = Group {
    name: "lease_reply",
    fields: &["now", "grants"],
};

/// alert_claim.lua's reply: one group per alert claimed (then, on a cluster,
/// when the queue is next due and when it was seen).
pub const ALERT_CLAIMED: Group = Group {
    name: "alert_claimed",
    fields: &["id", "record", "attempts"],
};

/// global_lease.lua's KEYS after the entries' hashes.
pub const LEASE_KEYS: Group = Group {
    name: "lease_keys",
    fields: &["messages"],
};

/// On a Redis Cluster, the end of alert_claim.lua's and alert_done.lua's
/// replies: the queue's earliest due ('-': empty) and the time of the call,
/// for the caller to index the queue (alert_index.lua).
pub const ALERT_SEEN_TAIL: Group = Group {
    name: "alert_seen_tail",
    fields: &["due", "seen"],
};

/// alert_claim.lua's KEYS (the index absent on a Redis Cluster).
pub const ALERT_CLAIM_KEYS: Group = Group {
    name: "alert_claim_keys",
    fields: &["queue", "records", "index"],
};

/// alert_claim.lua's ARGV.
pub const ALERT_CLAIM_ARGV: Group = Group {
    name: "alert_claim_argv",
    fields: &["most", "claim_us"],
};

/// alert_done.lua's KEYS (the index and the dropped count absent on a
/// Redis Cluster).
pub const ALERT_DONE_KEYS: Group = Group {
    name: "alert_done_keys",
    fields: &["queue", "records", "index", "dropped"],
};

/// alert_done.lua's ARGV.
pub const ALERT_DONE_ARGV: Group = Group {
    name: "alert_done_argv",
    fields: &[
        "id", // 1 sent, 2 to retry, 3 dropped.
        "mode", "retry_us",
    ],
};

/// alert_index.lua's KEYS.
pub const ALERT_INDEX_KEYS: Group = Group {
    name: "alert_index_keys",
    fields: &["index", "seen"],
};

/// alert_index.lua's ARGV.
pub const ALERT_INDEX_ARGV: Group = Group {
    name: "alert_index_argv",
    fields: &["queue", "seen", "due"],
};

/// line.lua's KEYS: a shared level's line — its state (the fair clocks,
/// the tenants' last finishes, the arrival count, its owners' liveness) and
/// one sorted set of tickets per priority class.
pub const LINE_KEYS: Group = Group {
    name: "line_keys",
    fields: &["state", "critical", "normal", "batch", "pending"],
};

/// line.lua's ARGV: every call gives them all (an operation ignores the
/// ones it does not read).
pub const LINE_ARGV: Group = Group {
    name: "line_argv",
    fields: &[
        "op", // 1 join, 2 head, 3 leave granted, 4 leave withdrawn, 5 wake
        "owner", "ticket", "class", "tenant", "weight", "cost", "wait_us", "most", "channel",
        "line",
    ],
};

/// reserve_first.lua's ARGV: then one [`RESERVE_FIRST_SIZES`] per
/// candidate, then each candidate's ARGV as reserve.lua takes them.
pub const RESERVE_FIRST_ARGV: Group = Group {
    name: "reserve_first_argv",
    fields: &["candidates"],
};

/// reserve_first.lua, per candidate: how many of KEYS and ARGV are its.
pub const RESERVE_FIRST_SIZES: Group = Group {
    name: "reserve_first_sizes",
    fields: &["keys", "args"],
};

/// config_set.lua's and config_seed.lua's KEYS.
pub const CONFIG_KEYS: Group = Group {
    name: "config_keys",
    fields: &["hash", "audit"],
};

/// config_set.lua's ARGV.
pub const CONFIG_SET_ARGV: Group = Group {
    name: "config_set_argv",
    fields: &[
        "field",
        // '' deletes the field.
        "document",
        "actor",
        "channel",
        "audit_keep",
        // '' or the configuration version the writer read the document at.
        "read_at",
        // The field holding the version of the document's last change.
        "changed_field",
    ],
};

/// config_set.lua's reply.
pub const CONFIG_SET_REPLY: Group = Group {
    name: "config_set_reply",
    fields: &["old", "version", "changed", "current"],
};

/// config_seed.lua's ARGV: then field, document pairs.
pub const CONFIG_SEED_ARGV: Group = Group {
    name: "config_seed_argv",
    fields: &["actor", "channel", "audit_keep"],
};

/// Every group, for `build.rs`.
pub const GROUPS: &[Group] = &[
    RESERVE,
    RESERVE_LEVEL,
    SETTLE,
    SETTLE_LEVEL,
    CHARGE,
    CHARGE_LEVEL,
    RENEW,
    STATUS,
    LEASE,
    LEASE_ENTRY,
    LEASE_BUCKET,
    BUCKET,
    RESERVE_REPLY,
    RESERVE_REPLY_LEVEL,
    RESERVE_ALLOWED,
    RESERVE_DENIED,
    RESERVE_REPLAYED,
    RESERVE_SPENT,
    RESERVE_FIRST_REPLY,
    SETTLE_APPLIED,
    SETTLE_BEFORE,
    RENEW_APPLIED,
    CHARGE_REPLY,
    STATUS_REPLY,
    STATUS_REPLY_LEVEL,
    LEASE_REPLY,
    ALERT_CLAIMED,
    RESERVE_ARGV,
    SETTLEMENT_ARGV,
    CHARGE_ARGV,
    STATUS_ARGV,
    LEASE_ARGV,
    LEDGER_ARGV,
    RESERVE_KEYS,
    SETTLEMENT_KEYS,
    LEASE_KEYS,
    ALERT_SEEN_TAIL,
    ALERT_CLAIM_KEYS,
    ALERT_CLAIM_ARGV,
    ALERT_DONE_KEYS,
    ALERT_DONE_ARGV,
    ALERT_INDEX_KEYS,
    ALERT_INDEX_ARGV,
    RESERVE_FIRST_ARGV,
    RESERVE_FIRST_SIZES,
    LINE_KEYS,
    LINE_ARGV,
    CONFIG_KEYS,
    CONFIG_SET_ARGV,
    CONFIG_SET_REPLY,
    CONFIG_SEED_ARGV,
];

/// `text` with every position written by name (`@{GROUP.field}`,
/// `@{GROUP}`, `@[GROUP.field]`, `@[GROUP]`, as the module says) replaced by
/// its number; a `+ ` before an offset of 0 goes with it. Errs naming a
/// group or field [`GROUPS`] lacks.
pub fn positions(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let (close, one_based) = match from.as_bytes().get(1) {
            Some(b'{') => ('}', false),
            Some(b'[') => (']', true),
            _ => {
                out.push('@');
                rest = &from[1..];
                continue;
            }
        };
        let Some(end) = from.find(close) else {
            return Err(format!("an unclosed position {from:.20}"));
        };
        let name = &from[2..end];
        rest = &from[end + 1..];
        let (group, field) = match name.split_once('.') {
            Some((g, f)) => (g, Some(f)),
            None => (name, None),
        };
        let Some(group) = GROUPS.iter().find(|g| g.name == group) else {
            return Err(format!("no spec group {group:?} in calls.rs"));
        };
        let at = match field {
            None => group.fields.len(),
            Some(f) => match group.fields.iter().position(|x| *x == f) {
                Some(at) => at,
                None => return Err(format!("{} has no field {f:?}", group.name)),
            },
        };
        match (one_based, field.is_some(), at) {
            (false, true, 0) if out.ends_with(" + ") => out.truncate(out.len() - 3),
            (false, _, n) => out.push_str(&n.to_string()),
            (true, _, n) => out.push_str(&(n + 1).to_string()),
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_written_by_name_become_the_numbers_the_groups_give() {
        let lua =
            "local nb, bit = spec[p + @{reserve_level.buckets}], spec[p + @{reserve_level.bit}]";
        assert_eq!(
            positions(lua).unwrap(),
            "local nb, bit = spec[p], spec[p + 5]",
            "an offset of 0 costs no addition"
        );
        assert_eq!(
            positions("local q = p + @{reserve_level}").unwrap(),
            "local q = p + 7"
        );
        assert_eq!(
            positions("spec[@[reserve.prompt]], FIRST = @[reserve]").unwrap(),
            "spec[2], FIRST = 13"
        );
        assert_eq!(
            positions("x@y, t[@]").unwrap(),
            "x@y, t[@]",
            "other @s stay"
        );
        assert!(
            positions("@{reserve.nothing}")
                .unwrap_err()
                .contains("no field")
        );
        assert!(
            positions("@{nothing}")
                .unwrap_err()
                .contains("no spec group")
        );
        assert!(positions("@{reserve").unwrap_err().contains("unclosed"));
    }
}
