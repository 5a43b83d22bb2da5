//! A [`Setting`] as configuration files write it (serde): a limit, the
//! word [`UNLIMITED`], or nothing (inherit the tier's).

use super::Setting;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::marker::PhantomData;

/// The word that removes a tier's limit in an override.
pub const UNLIMITED: &str = "unlimited";

impl<T: Serialize> Serialize for Setting<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Setting::Inherit => s.serialize_none(),
            Setting::Unlimited => s.serialize_str(UNLIMITED),
            Setting::Limit(v) => v.serialize(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Setting<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SettingVisitor(PhantomData))
    }
}

/// Reads a limit as `T`, or the word `unlimited`.
struct SettingVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for SettingVisitor<T> {
    type Value = Setting<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a limit, or \"{UNLIMITED}\" to remove the tier's")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == UNLIMITED {
            Ok(Setting::Unlimited)
        } else {
            Err(E::custom(format!(
                "{v:?} is not a limit: write \"{UNLIMITED}\" to remove the tier's limit, \
                 or leave the field out to keep it"
            )))
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Setting::Limit)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        T::deserialize(v.into_deserializer()).map(Setting::Limit)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq)).map(Setting::Limit)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Setting::Limit)
    }
}
