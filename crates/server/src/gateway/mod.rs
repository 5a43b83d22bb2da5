//! The gateways' own protocols, over [`crate::api`]'s authentication, gate
//! and answers: Envoy's rate limit service ([`rls`]) and its external
//! processor ([`ext_proc`]).

pub mod ext_proc;
pub mod rls;

pub use ext_proc::{ExtProcApi, LiveReading};
pub use rls::EnvoyApi;
pub use rls::descriptor::LiveMap;
