//! The gRPC codec: prost's, except that a request that does not decode (bad
//! wire format, a string field that is not UTF-8) is INVALID_ARGUMENT — the
//! caller sent bad input — rather than prost's INTERNAL, which would send
//! operators hunting for a bug in the service.

use crate::app::AppError;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The codec every generated service and client uses.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(ProstDecoder::default())
    }
}

/// Prost's decoder with decode failures reported as the caller's.
#[derive(Debug, Clone)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            // The caller sent bytes that are no valid request: fix the client.
            Status::from(AppError::invalid(format!(
                "the message is not a valid {}: {}; send messages built from ctxbudget's \
                 proto/ctxbudget/v1/budget.proto",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("message"),
                status.message()
            )))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
