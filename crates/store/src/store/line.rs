//! The lines of calls waiting for room at a shared level (the upstream
//! account, or a model group's limits there), kept with the level so that
//! every replica waits in one line: [`LineStore`]. The fair order is
//! [`crate::domain::queue::FairQueue`]'s; the memory store runs it, and
//! `lua/line.lua` is its Redis port (held to it by the differential test).
//! A ticket names its owner (the replica whose caller waits), so the
//! replicas can tell whose turn has come.

use futures_util::stream::BoxStream;
use std::future::Future;

/// A call asking to join a line.
#[derive(Clone, Copy, Debug)]
pub struct Joining<'a> {
    /// The line: a model group, or "" for the account's own limits.
    pub line: &'a str,
    /// The replica whose caller waits.
    pub owner: &'a str,
    /// Its priority class (0 critical, 1 normal, 2 batch).
    pub class: u8,
    /// Its tenant.
    pub tenant: &'a str,
    /// Its tenant's weight (> 0).
    pub weight: u32,
    /// What its grant takes (tokens, or the level's dimension).
    pub cost: u64,
    /// How long it may wait (µs): its ticket's deadline is this from now.
    pub wait_us: u64,
    /// The most calls the line holds (`[queue] max_queued`).
    pub most: usize,
}

/// A ticket in a line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    /// The line.
    pub line: String,
    /// Its priority class.
    pub class: u8,
    /// Its id in the line: `<arrival>|<owner>|<deadline>|<cost>|<weight>|<tenant>`.
    pub id: String,
}

/// The owner named in a ticket id.
pub fn owner_of(ticket: &str) -> &str {
    ticket.split('|').nth(1).unwrap_or("")
}

/// What joining answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Joined {
    /// In line, first or not.
    Waiting {
        /// Its ticket.
        ticket: Ticket,
        /// Whether it is first in line.
        first: bool,
    },
    /// The line holds its most already.
    Full {
        /// Calls waiting in it.
        waiting: usize,
    },
}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// First in line.
    pub first: bool,
    /// Still in line (false: its deadline passed, or its owner was taken for
    /// dead).
    pub waiting: bool,
}

/// How a ticket leaves its line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// Its call was granted: the line's fair clock moves past it.
    Granted,
    /// It went without a grant (its caller left, its time ran out, its own
    /// level denied it): it costs its tenant nothing.
    Withdrawn,
}

/// A line as it stands after an operation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LineView {
    /// The ticket first in line, if any.
    pub first: Option<String>,
    /// Calls waiting in it.
    pub waiting: usize,
}

/// What the other replicas said of the lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineMessage {
    /// This ticket is first in its line: its owner wakes it.
    Wake(String),
    /// This many calls wait in this line.
    Waiting {
        /// The line.
        line: String,
        /// Calls waiting.
        waiting: usize,
    },
}

impl LineMessage {
    /// A message as line.lua publishes it (`w|<ticket>`, `n|<waiting>|<line>`).
    pub fn parse(text: &str) -> Option<LineMessage> {
        match text.split_once('|')? {
            ("w", ticket) => Some(LineMessage::Wake(ticket.to_owned())),
            ("n", rest) => {
                let (n, line) = rest.split_once('|')?;
                Some(LineMessage::Waiting {
                    line: line.to_owned(),
                    waiting: n.parse().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// The lines of a shared level's waiting calls. Every operation first drops
/// the tickets at the head of the line whose deadline passed or whose owner
/// stopped beating (a replica that died), and counts the caller's owner as
/// alive for a few seconds.
pub trait LineStore: Send + Sync + 'static {
    /// Queues a ticket, unless the line holds its most already.
    fn join(
        &self,
        joining: &Joining<'_>,
    ) -> impl Future<Output = Result<Joined, super::StoreError>> + Send;

    /// Where `ticket` stands.
    fn standing(
        &self,
        ticket: &Ticket,
        owner: &str,
    ) -> impl Future<Output = Result<Standing, super::StoreError>> + Send;

    /// Takes `ticket` out of its line (nothing when it is gone already); the
    /// line after, whose first ticket is woken when another replica owns it.
    fn leave(
        &self,
        ticket: &Ticket,
        owner: &str,
        how: Leave,
    ) -> impl Future<Output = Result<LineView, super::StoreError>> + Send;

    /// The line as it stands, its first ticket woken when another replica
    /// owns it: room may have come (a Commit or Refund), or a heartbeat.
    fn wake(
        &self,
        line: &str,
        owner: &str,
    ) -> impl Future<Output = Result<LineView, super::StoreError>> + Send;

    /// What the other replicas say of the lines, as it comes: none where no
    /// other replica shares the lines (the memory store) or no subscription
    /// can be made (a Redis Cluster: owners then find their turn by their
    /// own timers and heartbeats).
    fn line_messages(
        &self,
    ) -> impl Future<Output = Option<BoxStream<'static, LineMessage>>> + Send {
        async { None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_line_lua_writes_them() {
        assert_eq!(
            LineMessage::parse("w|000000000001|ab12|5|1000|1|acme|x"),
            Some(LineMessage::Wake(
                "000000000001|ab12|5|1000|1|acme|x".into()
            ))
        );
        assert_eq!(
            LineMessage::parse("n|3|gpt-4o"),
            Some(LineMessage::Waiting {
                line: "gpt-4o".into(),
                waiting: 3
            })
        );
        assert_eq!(LineMessage::parse("n|x|g"), None);
        assert_eq!(owner_of("000000000001|ab12|5|1000|1|acme"), "ab12");
    }
}
