//! `ctxbudget bench --api http`: the budget API as an HTTP-only gateway calls
//! it — `POST /v1/check-and-reserve`, `/v1/commit`, `/v1/refund` with JSON
//! bodies in protobuf's JSON mapping, over keep-alive HTTP/1.1 connections.
//! A 429, 413 or 403 with the response's JSON is a denial; any other status
//! but 200 is an error.

use super::workload::{Item, Reply};
use crate::pb;

/// A service's HTTP listener.
pub struct HttpTarget {
    client: reqwest::Client,
    base: String,
}

impl HttpTarget {
    /// Calls `base` (`http://127.0.0.1:8080`) over at most `connections`
    /// idle keep-alive connections.
    pub fn new(base: &str, connections: usize) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(connections.max(1) * 16)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(HttpTarget {
            client,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    async fn post<T: serde::Serialize>(
        &self,
        rpc: &str,
        body: &T,
    ) -> Result<(u16, Vec<u8>), String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let response = self
            .client
            .post(format!("{}/v1/{rpc}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("http: {e}"))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|e| format!("http: {e}"))?;
        Ok((status, bytes.to_vec()))
    }

    /// CheckAndReserve for one workload item.
    pub async fn reserve(&self, item: &Item, tier: &str) -> Result<Reply, String> {
        let req = item.reserve_request(tier);
        let (status, body) = self.post("check-and-reserve", &req).await?;
        if !matches!(status, 200 | 403 | 413 | 429) {
            return Err(format!("http_{status}"));
        }
        let r: pb::CheckAndReserveResponse =
            serde_json::from_slice(&body).map_err(|_| format!("http_{status}"))?;
        Ok(Reply {
            allowed: r.allowed,
            reason: super::workload::pb_reason_name(r.reason()),
            reservation_id: r.reservation_id,
            reserved_output: r.reserved_output_tokens,
        })
    }

    /// Commit.
    pub async fn commit(&self, id: &str, prompt: u64, completion: u64) -> Result<(), String> {
        let req = pb::CommitRequest {
            reservation_id: id.to_string(),
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Default::default()
        };
        match self.post("commit", &req).await? {
            (200, _) => Ok(()),
            (status, _) => Err(format!("http_{status}")),
        }
    }

    /// Refund.
    pub async fn refund(&self, id: &str) -> Result<(), String> {
        let req = pb::RefundRequest {
            reservation_id: id.to_string(),
        };
        match self.post("refund", &req).await? {
            (200, _) => Ok(()),
            (status, _) => Err(format!("http_{status}")),
        }
    }
}
