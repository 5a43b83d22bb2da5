//! Random bytes and random messages through request validation (the fuzz
//! target's function, `validate::check_bytes`, here for a bounded number of
//! cases): whatever the input, an answer and no panic.

use super::validate::check_bytes;
use crate::pb;
use proptest::prelude::*;
use prost::Message;

/// A CheckAndReserve for 100 prompt and 100 output tokens on `tier`.
fn reserve(tier: &str) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
        tier: tier.into(),
        model: "gpt-4o".into(),
        prompt_tokens: Some(100),
        max_output_tokens: 100,
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = check_bytes(&data);
    }

    #[test]
    fn random_messages_never_panic(
        tenant in ".{0,300}",
        user in "\\PC{0,80}",
        tier in "[a-z]{0,5}|free|pro|.{0,70}",
        model in ".{0,300}",
        prompt_tokens in proptest::option::of(any::<u64>()),
        max_output_tokens in any::<u64>(),
        key in ".{0,300}",
        lease in proptest::option::of(any::<u64>()),
        min_output in any::<u64>(),
        reduced in any::<bool>(),
        id in "rsv_[A-Za-z0-9_-]{0,120}|.{0,200}",
    ) {
        let reserve = pb::CheckAndReserveRequest {
            tenant_id: tenant.clone(),
            user_id: user.clone(),
            tier: tier.clone(),
            model,
            prompt_tokens,
            max_output_tokens,
            idempotency_key: key,
            lease_ttl_ms: lease,
            allow_reduced_output: reduced,
            min_output_tokens: min_output,
            ..Default::default()
        };
        let mut data = vec![0u8];
        reserve.encode(&mut data).unwrap();
        let _ = check_bytes(&data);
        let mut data = vec![1u8];
        pb::CommitRequest { reservation_id: id, prompt_tokens: max_output_tokens, completion_tokens: 1, ..Default::default() }
            .encode(&mut data)
            .unwrap();
        let _ = check_bytes(&data);
        let mut data = vec![4u8];
        pb::GetStatusRequest { tenant_id: tenant, user_id: user, tier, ..Default::default() }.encode(&mut data).unwrap();
        let _ = check_bytes(&data);
    }
}

#[test]
fn valid_requests_pass_validation() {
    let mut data = vec![0u8];
    reserve("free").encode(&mut data).unwrap();
    assert!(check_bytes(&data).is_ok(), "{:?}", check_bytes(&data));
    let mut data = vec![0u8];
    reserve("nope").encode(&mut data).unwrap();
    assert!(check_bytes(&data).unwrap_err().contains("unknown tier"));
}
