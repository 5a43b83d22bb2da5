//! A level's limits of every rate dimension as written: one key per
//! dimension, by its name (`requests = [...]`, `spend = [...]`, …), read into
//! a [`DimMap`]. A section flattens it beside its other keys, so a new
//! dimension is a new key everywhere a level's limits are written — levels,
//! tiers, model groups, shadows and overrides — with no field to add.

use crate::domain::{DimMap, Dimension};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::marker::PhantomData;

/// What a level says about one dimension when it says nothing (an empty
/// list; an override's inherit): left out when written.
pub trait Unset {
    /// True when nothing is said.
    fn is_unset(&self) -> bool;
}

impl<T> Unset for Vec<T> {
    fn is_unset(&self) -> bool {
        self.is_empty()
    }
}

/// A value per rate dimension, written as one key per dimension named.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ByDimension<T>(pub DimMap<T>);

impl<T: Unset> ByDimension<T> {
    /// True when no dimension is named.
    pub fn is_unset(&self) -> bool {
        self.0.iter().all(|(_, v)| v.is_unset())
    }
}

impl<T: Serialize + Unset> Serialize for ByDimension<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (d, v) in self.0.iter().filter(|(_, v)| !v.is_unset()) {
            map.serialize_entry(d.as_str(), v)?;
        }
        map.end()
    }
}

/// A section that holds a [`ByDimension`] beside keys of its own, read by
/// [`read_section`]: every key read in place, so an error names its whole
/// path (`user.requests[0].limit`), which a serde `flatten` would lose.
pub trait WithDimensions<'de>: Default {
    /// The value of each dimension.
    type Rates: Deserialize<'de> + Default;
    /// The dimensions' values, to fill.
    fn rates(&mut self) -> &mut ByDimension<Self::Rates>;
    /// The section's own keys, for messages.
    const KEYS: &'static [&'static str];
    /// Reads the value of `key` if it is one of the section's own.
    fn read_own<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;
}

/// Reads a section of `S` from `d`: each dimension's key into its rates,
/// the section's own keys, and an error naming the keys for any other.
pub fn read_section<'de, S: WithDimensions<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<S, D::Error> {
    d.deserialize_map(SectionVisitor::<S>(PhantomData))
}

struct SectionVisitor<S>(PhantomData<S>);

impl<'de, S: WithDimensions<'de>> Visitor<'de> for SectionVisitor<S> {
    type Value = S;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a level's limits")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<S, A::Error> {
        let mut out = S::default();
        while let Some(key) = map.next_key::<String>()? {
            if let Some(dimension) = Dimension::RATES.into_iter().find(|d| d.as_str() == key) {
                out.rates().0[dimension] = map.next_value()?;
            } else if !out.read_own(&key, &mut map)? {
                return Err(de::Error::custom(format!(
                    "unknown field `{key}`, expected one of {}, {}",
                    names(),
                    S::KEYS.join(", ")
                )));
            }
        }
        Ok(out)
    }
}

/// The rate dimensions' names, for messages: `requests, tokens, …`.
pub fn names() -> String {
    Dimension::RATES.map(Dimension::as_str).join(", ")
}
