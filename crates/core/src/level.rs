//! The scopes a request is checked against and what a limit counts: the
//! vocabulary every plan, reading and decision is written in.

pub use super::dimension::{DimMap, Dimension};
use std::fmt;

/// The nested scopes a request is checked against, outermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// The whole upstream account.
    Global,
    /// One customer.
    Tenant,
    /// One user of a tenant.
    User,
    /// One session (agent run, trace, conversation) of a user: optional,
    /// short-lived, its keys expiring after the tier's `session_ttl` unused.
    Session,
}

impl Level {
    /// Every level, outermost first.
    pub const ALL: [Level; 4] = [Level::Global, Level::Tenant, Level::User, Level::Session];

    /// A bit per level, used to remember which levels hold a reservation's
    /// lease. The session's bits come after the three levels' and their
    /// groups' slots (1 2 4, then 8 16 32), so records stored before the
    /// session level read the same.
    pub fn bit(self) -> u8 {
        match self {
            Level::Global => 1,
            Level::Tenant => 2,
            Level::User => 4,
            Level::Session => 64,
        }
    }

    /// The bit of a model group's concurrency slots at this level.
    pub fn slots_bit(self) -> u8 {
        match self {
            Level::Session => 128,
            level => level.bit() << 3,
        }
    }

    /// Lower-case name for messages and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Global => "global",
            Level::Tenant => "tenant",
            Level::User => "user",
            Level::Session => "session",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A period as people write it: `60s` → `1m`, `86400s` → `1d`.
pub fn period_label(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
