//! The lines of waiting calls on Redis: each operation one call of
//! `lua/line.lua` (its KEYS and ARGV by `calls.rs`' `LINE_KEYS` and
//! `LINE_ARGV`), and the subscription to what the other replicas publish.

use super::RedisStore;
use super::wire::{Args, int_at, string_at};
use crate::store::StoreError;
use crate::store::line::{
    Joined, Joining, Leave, LineMessage, LineStore, LineView, Standing, Ticket,
};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use redis::Value;

/// One line.lua call's operation and what it names.
struct Op<'a> {
    code: u8,
    line: &'a str,
    owner: &'a str,
    ticket: &'a str,
    class: u8,
    joining: Option<&'a Joining<'a>>,
}

impl RedisStore {
    async fn line_call(&self, op: Op<'_>) -> Result<Vec<Value>, StoreError> {
        use super::spec::{line_argv as a, line_keys as k};
        let [state, critical, normal, batch, pending] = self.keys.line(op.line);
        let mut inv = self.line.prepare_invoke();
        let mut args = Args::new(&mut inv);
        args.key(k::STATE, state)
            .key(k::CRITICAL, critical)
            .key(k::NORMAL, normal)
            .key(k::BATCH, batch)
            .key(k::PENDING, pending);
        let j = op.joining;
        args.at(a::OP, op.code)
            .at(a::OWNER, op.owner)
            .at(a::TICKET, op.ticket)
            .at(a::CLASS, op.class)
            .at(a::TENANT, j.map_or("", |j| j.tenant))
            .at(a::WEIGHT, j.map_or(1, |j| j.weight))
            .at(a::COST, j.map_or(0, |j| j.cost))
            .at(a::WAIT_US, j.map_or(0, |j| j.wait_us))
            .at(a::MOST, j.map_or(0, |j| j.most))
            .at(a::CHANNEL, self.keys.line_channel())
            .at(a::LINE, op.line);
        self.run(&inv).await
    }
}

/// A `{first ('' none), waiting}` reply.
fn view(reply: &[Value]) -> Result<LineView, StoreError> {
    let first = string_at(reply, 0)?;
    Ok(LineView {
        first: (!first.is_empty()).then_some(first),
        waiting: usize::try_from(int_at(reply, 1)?).unwrap_or(0),
    })
}

impl LineStore for RedisStore {
    async fn join(&self, j: &Joining<'_>) -> Result<Joined, StoreError> {
        let op = Op {
            code: 1,
            line: j.line,
            owner: j.owner,
            ticket: "",
            class: j.class,
            joining: Some(j),
        };
        let reply = self.line_call(op).await?;
        if int_at(&reply, 0)? == 0 {
            let waiting = usize::try_from(int_at(&reply, 1)?).unwrap_or(0);
            return Ok(Joined::Full { waiting });
        }
        let ticket = Ticket {
            line: j.line.to_owned(),
            class: j.class,
            id: string_at(&reply, 1)?,
        };
        let first = int_at(&reply, 2)? == 1;
        Ok(Joined::Waiting { ticket, first })
    }

    async fn standing(&self, t: &Ticket, owner: &str) -> Result<Standing, StoreError> {
        let op = Op {
            code: 2,
            line: &t.line,
            owner,
            ticket: &t.id,
            class: t.class,
            joining: None,
        };
        let reply = self.line_call(op).await?;
        Ok(Standing {
            first: int_at(&reply, 0)? == 1,
            waiting: int_at(&reply, 1)? == 1,
        })
    }

    async fn leave(&self, t: &Ticket, owner: &str, how: Leave) -> Result<LineView, StoreError> {
        let code = match how {
            Leave::Granted => 3,
            Leave::Withdrawn => 4,
        };
        let op = Op {
            code,
            line: &t.line,
            owner,
            ticket: &t.id,
            class: t.class,
            joining: None,
        };
        view(&self.line_call(op).await?)
    }

    async fn wake(&self, line: &str, owner: &str) -> Result<LineView, StoreError> {
        let op = Op {
            code: 5,
            line,
            owner,
            ticket: "",
            class: 0,
            joining: None,
        };
        view(&self.line_call(op).await?)
    }

    async fn line_messages(&self) -> Option<BoxStream<'static, LineMessage>> {
        let client = self.client.as_ref()?;
        let mut pubsub = match client.get_async_pubsub().await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "cannot subscribe to the lines' wake-ups yet");
                return None;
            }
        };
        if let Err(e) = pubsub.subscribe(self.keys.line_channel()).await {
            tracing::debug!(error = %e, "cannot subscribe to the lines' wake-ups yet");
            return None;
        }
        let messages = pubsub.into_on_message().filter_map(|m| async move {
            let text: String = m.get_payload().ok()?;
            LineMessage::parse(&text)
        });
        Some(messages.boxed())
    }
}
