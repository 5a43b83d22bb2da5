//! One call to Redis under the store deadline: a script invocation or a plain
//! pipeline, on the next connection, its error classified (transient, maybe
//! applied, or not understood).

use super::RedisStore;
use super::errors::classify;
use crate::store::StoreError;
use redis::{RedisError, ScriptInvocation, Value};
use std::future::Future;

impl RedisStore {
    /// Runs one script invocation under the store deadline.
    ///
    /// The redis-rs call is boxed: its future is about 7 KB, and unboxed every
    /// future above it (store, engine, handler, tonic's own box) held it, some
    /// twice, so each call copied tens of KB on the way down (`perf`: 11% of the
    /// service's CPU in `memmove`).
    pub(super) async fn run(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let call = Box::pin(async {
            let mut conn = self.connections.next().await?;
            invocation.invoke_async::<Vec<Value>>(&mut conn).await
        });
        self.within_deadline(call).await
    }

    /// Runs a plain pipeline (no scripts) under the store deadline; boxed as in `run`.
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        let call = Box::pin(async {
            let mut conn = self.connections.next().await?;
            pipe.query_async::<T>(&mut conn).await
        });
        self.within_deadline(call).await
    }

    /// `call`'s result, or `Unanswered` once the store deadline passes.
    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| classify(&self.url, e)),
            Err(_) => Err(StoreError::Unanswered(
                format!(
                    "{} did not answer within {} ms",
                    self.url,
                    self.timeout.as_millis()
                )
                .into(),
            )),
        }
    }
}
