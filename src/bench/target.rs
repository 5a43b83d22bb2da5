//! What a benchmark drives: the service over gRPC (its own API, Envoy's
//! rate limit API or its external processor), or an engine over a store called directly (the Redis
//! ceiling, and the memory store's own speed).

use super::ext_proc::ExtProcTarget;
use super::http::HttpTarget;
use super::workload::{BENCH_MODEL, Item, Reply, pb_reason_name};
use crate::domain::plan::ReserveRequest;
use crate::domain::{PromptInput, Reason, ReservationId, TenantId, UserId};
use crate::engine::{CommitRequest, Completion, Engine, EngineError};
use crate::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::pb;
use crate::pb::budget_service_client::BudgetServiceClient;
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tonic::transport::Channel;

/// Something to reserve against.
pub enum Target {
    /// A ctxbudget service over gRPC, spreading calls over a few HTTP/2 connections.
    Grpc {
        /// One client per connection.
        clients: Vec<BudgetServiceClient<Channel>>,
        /// Round-robin cursor.
        next: AtomicUsize,
    },
    /// An engine over the memory store, called in-process.
    Memory(Arc<Engine<MemoryStore>>),
    /// An engine over Redis, called in-process: one EVALSHA per call, no gRPC.
    Redis(Arc<Engine<RedisStore>>),
    /// A ctxbudget service over Envoy's rate limit API, as Envoy calls it: a
    /// reservation is the request path (one request taken), a Commit the
    /// response path (the tokens used charged), a Refund nothing.
    Envoy {
        /// One client per connection.
        clients: Vec<RateLimitServiceClient<Channel>>,
        /// Round-robin cursor.
        next: AtomicUsize,
    },
    /// A ctxbudget service's external processor, as Envoy's ext_proc filter
    /// calls it: one stream per request, held open around the upstream call.
    ExtProc(ExtProcTarget),
    /// A ctxbudget service's HTTP/JSON API (`POST /v1/…`).
    Http(HttpTarget),
}

/// Which API a gRPC target is driven through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// `ctxbudget.v1.BudgetService`: CheckAndReserve, Commit, Refund.
    #[default]
    Budget,
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    Envoy,
    /// `envoy.service.ext_proc.v3.ExternalProcessor/Process`.
    #[value(name = "ext_proc")]
    ExtProc,
    /// The HTTP/JSON API: `POST /v1/check-and-reserve`, `/v1/commit`,
    /// `/v1/refund` (the service's `[http] listen`).
    Http,
}

fn reason_name(r: Reason) -> &'static str {
    r.as_str()
}

fn engine_error(e: EngineError) -> String {
    match e {
        EngineError::Invalid(_) => "invalid_argument".into(),
        EngineError::NotFound(_) => "not_found".into(),
        EngineError::FailedPrecondition(_) => "failed_precondition".into(),
        EngineError::Store(s) if s.is_transient() => "unavailable".into(),
        EngineError::Store(_) => "internal".into(),
    }
}

fn status_error(s: tonic::Status) -> String {
    format!("{:?}", s.code()).to_lowercase()
}

impl Target {
    /// Connects `connections` clients to a gRPC endpoint, for `api`.
    pub async fn grpc(endpoint: &str, connections: usize, api: Api) -> Result<Self, String> {
        let mut channels = Vec::new();
        for _ in 0..connections.max(1) {
            let channel = Channel::from_shared(endpoint.to_string())
                .map_err(|e| format!("--target {endpoint}: {e}"))?
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
            channels.push(channel);
        }
        let next = AtomicUsize::new(0);
        Ok(match api {
            Api::Budget => Target::Grpc {
                clients: channels.into_iter().map(BudgetServiceClient::new).collect(),
                next,
            },
            Api::Envoy => Target::Envoy {
                clients: channels
                    .into_iter()
                    .map(RateLimitServiceClient::new)
                    .collect(),
                next,
            },
            Api::ExtProc => Target::ExtProc(ExtProcTarget::new(channels)),
            Api::Http => return Target::http(endpoint, connections),
        })
    }

    /// Calls the HTTP/JSON API at `base` (`http://127.0.0.1:8080`).
    pub fn http(base: &str, connections: usize) -> Result<Self, String> {
        Ok(Target::Http(HttpTarget::new(base, connections)?))
    }

    fn client(
        clients: &[BudgetServiceClient<Channel>],
        next: &AtomicUsize,
    ) -> BudgetServiceClient<Channel> {
        Self::pick(clients, next)
    }

    fn pick<T: Clone>(clients: &[T], next: &AtomicUsize) -> T {
        clients[next.fetch_add(1, Ordering::Relaxed) % clients.len()].clone()
    }

    /// CheckAndReserve for one workload item.
    pub async fn reserve(&self, item: &Item, tier: &str) -> Result<Reply, String> {
        match self {
            Target::Grpc { clients, next } => {
                let req = item.reserve_request(tier);
                let r = Self::client(clients, next)
                    .check_and_reserve(req)
                    .await
                    .map_err(status_error)?
                    .into_inner();
                Ok(Reply {
                    allowed: r.allowed,
                    reason: pb_reason_name(r.reason()),
                    reservation_id: r.reservation_id,
                    // A server before reserved_output_tokens held the grant.
                    reserved_output: match r.reserved_output_tokens {
                        0 => r.granted_max_output_tokens,
                        n => n,
                    },
                })
            }
            Target::Memory(e) => engine_reserve(e, item, tier).await,
            Target::Redis(e) => engine_reserve(e, item, tier).await,
            Target::ExtProc(x) => x.reserve(item, tier).await,
            Target::Http(h) => h.reserve(item, tier).await,
            Target::Envoy { clients, next } => {
                let r = Self::pick(clients, next)
                    .should_rate_limit(envoy_request(item, tier, None))
                    .await
                    .map_err(status_error)?
                    .into_inner();
                let allowed = r.overall_code() != Code::OverLimit;
                Ok(Reply {
                    allowed,
                    reason: if allowed { "allowed" } else { "over_limit" },
                    reservation_id: String::new(),
                    reserved_output: item.max_output,
                })
            }
        }
    }

    /// Commit `item`'s simulated usage (reservation `id`).
    pub async fn commit(&self, item: &Item, tier: &str, id: &str) -> Result<(), String> {
        let (prompt, completion) = (item.prompt, item.completion);
        match self {
            Target::ExtProc(x) => x.commit(item, id).await,
            Target::Http(h) => h.commit(id, prompt, completion).await,
            Target::Envoy { clients, next } => Self::pick(clients, next)
                .should_rate_limit(envoy_request(item, tier, Some(prompt + completion)))
                .await
                .map(drop)
                .map_err(status_error),
            Target::Grpc { clients, next } => Self::client(clients, next)
                .commit(pb::CommitRequest {
                    reservation_id: id.to_string(),
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(status_error),
            Target::Memory(e) => e
                .commit(commit_request(id, prompt, completion)?)
                .await
                .map(drop)
                .map_err(engine_error),
            Target::Redis(e) => e
                .commit(commit_request(id, prompt, completion)?)
                .await
                .map(drop)
                .map_err(engine_error),
        }
    }

    /// Refund.
    pub async fn refund(&self, id: &str) -> Result<(), String> {
        match self {
            // A failed call charges nothing on Envoy's response path.
            Target::Envoy { .. } => Ok(()),
            Target::ExtProc(x) => x.refund(id).await,
            Target::Http(h) => h.refund(id).await,
            Target::Grpc { clients, next } => Self::client(clients, next)
                .refund(pb::RefundRequest {
                    reservation_id: id.to_string(),
                })
                .await
                .map(drop)
                .map_err(status_error),
            Target::Memory(e) => e
                .refund(&parse_id(id)?)
                .await
                .map(drop)
                .map_err(engine_error),
            Target::Redis(e) => e
                .refund(&parse_id(id)?)
                .await
                .map(drop)
                .map_err(engine_error),
        }
    }
}

/// What Envoy sends for `item` with the descriptor of docs/envoy.md: the
/// request path (one request) or, with `tokens`, the response path.
fn envoy_request(item: &Item, tier: &str, tokens: Option<u64>) -> RateLimitRequest {
    let entry = |key: &str, value: String| Entry {
        key: key.into(),
        value,
    };
    let mut entries = vec![
        entry("tenant", item.tenant_id()),
        entry("user", item.user_id()),
        entry("tier", tier.to_string()),
        entry("model", BENCH_MODEL.into()),
    ];
    if tokens.is_some() {
        entries.push(entry("phase", "response".into()));
    }
    RateLimitRequest {
        domain: "llm".into(),
        descriptors: vec![RateLimitDescriptor {
            entries,
            limit: None,
            hits_addend: tokens,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    }
}

/// A reservation id the engine issued, parsed as the API would.
fn parse_id(id: &str) -> Result<ReservationId, String> {
    ReservationId::parse(id).map_err(|e| e.to_string())
}

/// The Commit of `id` with the upstream's counts, as the API would parse it.
fn commit_request(id: &str, prompt: u64, completion: u64) -> Result<CommitRequest, String> {
    Ok(CommitRequest {
        id: parse_id(id)?,
        prompt_tokens: prompt,
        completion: Completion::Tokens(completion),
        cached_prompt_tokens: 0,
        cache_write_prompt_tokens: 0,
        cache_write_1h_prompt_tokens: 0,
        reasoning_tokens: 0,
        declared: Default::default(),
    })
}

async fn engine_reserve<S: Store>(
    engine: &Engine<S>,
    item: &Item,
    tier: &str,
) -> Result<Reply, String> {
    let req = ReserveRequest {
        tenant: TenantId::parse(&item.tenant_id()).map_err(|e| e.to_string())?,
        user: Some(UserId::parse(&item.user_id()).map_err(|e| e.to_string())?),
        session: None,
        tier: tier.to_string(),
        model: BENCH_MODEL.into(),
        fallbacks: Vec::new(),
        statuses: Default::default(),
        prompt: match item.prompt_as_text {
            true => PromptInput::Text(crate::domain::Prompt::Text(item.prompt_text())),
            false => PromptInput::Tokens(item.prompt),
        },
        max_output_tokens: item.max_output,
        min_output_tokens: None,
        idempotency_key: None,
        lease_ttl_ms: None,
        priority: crate::domain::Priority::Normal,
        declared: Default::default(),
    };
    let out = engine.reserve(req).await.map_err(engine_error)?;
    Ok(Reply {
        allowed: out.denial.is_none(),
        reason: out.denial.map_or("allowed", |d| reason_name(d.reason)),
        reservation_id: out.reservation_id.unwrap_or_default(),
        reserved_output: out.reserved_output_tokens,
    })
}
