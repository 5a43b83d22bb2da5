//! The document kinds of the live configuration and their rules: what a
//! `set` parses and checks (the document alone, then the whole
//! configuration with it), what a `delete` may remove, and how `list` and
//! `get` show them. The CLI's verbs and the admin API's routes are both
//! made of these.

use super::AdminError;
use crate::config::live::{ConfigDoc, document};
use crate::config::{
    EnvoySection, ExtProcSection, LevelSection, ModelSection, OverrideSection, PriceSection,
    TierSection, build_limits, parse_document,
};
use crate::domain::TenantId;
use crate::store::config_repo::Field;
use serde::Serialize;
use serde_json::Value;

/// A kind of document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `[tiers.<name>]`.
    Tier,
    /// `[models.<group>]`.
    Model,
    /// `[prices.<group>]`.
    Price,
    /// `[overrides.<tenant>]`, blocks included.
    Override,
    /// `[envoy]`.
    Envoy,
    /// `[ext_proc]`.
    ExtProc,
    /// `[global]`.
    Global,
}

/// Every kind, in the order the admin API lists them.
pub const KINDS: [Kind; 7] = [
    Kind::Tier,
    Kind::Model,
    Kind::Price,
    Kind::Override,
    Kind::Envoy,
    Kind::ExtProc,
    Kind::Global,
];

impl Kind {
    /// The admin API's path segment (`/admin/v1/<segment>`).
    pub fn segment(self) -> &'static str {
        match self {
            Kind::Tier => "tiers",
            Kind::Model => "models",
            Kind::Price => "prices",
            Kind::Override => "overrides",
            Kind::Envoy => "envoy",
            Kind::ExtProc => "ext-proc",
            Kind::Global => "global",
        }
    }

    /// The kind of a path segment.
    pub fn of_segment(segment: &str) -> Option<Kind> {
        KINDS.into_iter().find(|k| k.segment() == segment)
    }

    /// True for kinds with many named documents (tiers, models, prices,
    /// overrides); false for the single sections.
    pub fn named(self) -> bool {
        matches!(
            self,
            Kind::Tier | Kind::Model | Kind::Price | Kind::Override
        )
    }

    /// The configuration file's key of its documents (`tiers.pro.…` in errors).
    fn key(self) -> &'static str {
        match self {
            Kind::Tier => "tiers",
            Kind::Model => "models",
            Kind::Price => "prices",
            Kind::Override => "overrides",
            Kind::Envoy => "envoy",
            Kind::ExtProc => "ext_proc",
            Kind::Global => "global",
        }
    }

    /// The field of document `name` (ignored for the single sections).
    pub fn field(self, name: &str) -> Field {
        match self {
            Kind::Tier => Field::Tier(name.into()),
            Kind::Model => Field::Model(name.into()),
            Kind::Price => Field::Price(name.into()),
            Kind::Override => Field::Override(name.into()),
            Kind::Envoy => Field::Envoy,
            Kind::ExtProc => Field::ExtProc,
            Kind::Global => Field::Global,
        }
    }
}

/// One change, checked: the document to write (`None`: delete) and a note
/// for the person making it, if any.
#[derive(Clone, Debug)]
pub struct Change {
    /// The document.
    pub field: Field,
    /// Its new text; `None` deletes it.
    pub document: Option<String>,
    /// What else the writer should know (a block that stays).
    pub note: Option<String>,
    /// The document existed before the change.
    pub existed: bool,
}

/// Document `name` of `kind` as JSON (a single section: the one stored, or
/// its defaults; `name` is ignored), or NotFound naming those that exist.
pub fn get(doc: &ConfigDoc, kind: Kind, name: &str) -> Result<Value, AdminError> {
    let found = match kind {
        Kind::Tier => doc.tiers.get(name).map(json),
        Kind::Model => doc.models.get(name).map(json),
        Kind::Price => doc.prices.get(name).map(json),
        Kind::Override => doc.overrides.get(name).map(json),
        Kind::Envoy => Some(json(&doc.envoy.clone().unwrap_or_default())),
        Kind::ExtProc => Some(json(&doc.ext_proc.clone().unwrap_or_default())),
        Kind::Global => Some(json(&doc.global.clone().unwrap_or_default())),
    };
    found.ok_or_else(|| not_found(doc, kind, name))
}

/// The names of `kind`'s documents, in order (none for a single section).
pub fn names(doc: &ConfigDoc, kind: Kind) -> Vec<String> {
    match kind {
        Kind::Tier => doc.tiers.keys().cloned().collect(),
        Kind::Model => doc.models.keys().cloned().collect(),
        Kind::Price => doc.prices.keys().cloned().collect(),
        Kind::Override => doc.overrides.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Names a not-found message lists at most.
const SHOWN: usize = 20;

fn not_found(doc: &ConfigDoc, kind: Kind, name: &str) -> AdminError {
    let known = names(doc, kind);
    let list = |plural: &str| match known.len() {
        0 => format!("there are no {plural} yet"),
        n if n > SHOWN => format!(
            "the {plural} are: {}, and {} more",
            known[..SHOWN].join(", "),
            n - SHOWN
        ),
        _ => format!("the {plural} are: {}", known.join(", ")),
    };
    AdminError::NotFound(match kind {
        Kind::Tier => format!("no tier {name:?}; {}", list("tiers")),
        Kind::Model => format!("no model group {name:?}; {}", list("groups")),
        Kind::Price => format!(
            "model group {name:?} has no price; {}",
            list("groups with one")
        ),
        Kind::Override => format!(
            "tenant {name} has no override; {}",
            list("tenants with one")
        ),
        _ => format!("no {} document", kind.key()),
    })
}

/// `text` (TOML or JSON) as a section of `kind`; errors name the field
/// (`tiers.pro.user.requests`).
fn parse<T: serde::de::DeserializeOwned>(
    kind: Kind,
    name: &str,
    text: &str,
) -> Result<T, AdminError> {
    let at = match kind.named() {
        true => format!("{}.{name}", kind.key()),
        false => kind.key().to_string(),
    };
    parse_document(text).map_err(|e| AdminError::Invalid(format!("{at}.{e}; nothing was written")))
}

/// `text` (TOML or JSON) as document `name` of `kind`, checked alone and as
/// part of `doc`, which is left holding it.
pub fn set(doc: &mut ConfigDoc, kind: Kind, name: &str, text: &str) -> Result<Change, AdminError> {
    let invalid =
        |e: crate::domain::LimitsError| AdminError::Invalid(format!("{e}; nothing was written"));
    let existed = exists(doc, kind, name);
    let text = match kind {
        Kind::Tier => {
            let s: TierSection = parse(kind, name, text)?;
            s.to_domain(name).map_err(invalid)?;
            doc.tiers.insert(name.into(), s.clone());
            document(&s)
        }
        Kind::Model => {
            let s: ModelSection = parse(kind, name, text)?;
            s.to_domain(name).map_err(invalid)?;
            doc.models.insert(name.into(), s.clone());
            document(&s)
        }
        Kind::Price => {
            let s: PriceSection = parse(kind, name, text)?;
            doc.prices.insert(name.into(), s.clone());
            document(&s)
        }
        Kind::Override => {
            TenantId::parse(name).map_err(|e| {
                AdminError::Invalid(format!("tenant: {}; nothing was written", e.message))
            })?;
            let mut s: OverrideSection = parse(kind, name, text)?;
            // Blocks are lifted with `unblock` alone, never by a new deal.
            if let Some(old) = doc.overrides.get(name) {
                keep_blocks(old, &mut s);
            }
            s.to_domain(name).map_err(invalid)?;
            doc.overrides.insert(name.into(), s.clone());
            document(&s)
        }
        Kind::Envoy => {
            let s: EnvoySection = parse(kind, name, text)?;
            doc.envoy = Some(s.clone());
            document(&s)
        }
        Kind::ExtProc => {
            let s: ExtProcSection = parse(kind, name, text)?;
            doc.ext_proc = Some(s.clone());
            document(&s)
        }
        Kind::Global => {
            let s: LevelSection = parse(kind, name, text)?;
            doc.global = Some(s.clone());
            document(&s)
        }
    };
    check_whole(doc)?;
    Ok(Change {
        field: kind.field(name),
        document: Some(text),
        note: None,
        existed,
    })
}

/// True when `doc` stores document `name` of `kind` (a single section:
/// when one is stored, not its defaults).
pub fn exists(doc: &ConfigDoc, kind: Kind, name: &str) -> bool {
    match kind {
        Kind::Tier => doc.tiers.contains_key(name),
        Kind::Model => doc.models.contains_key(name),
        Kind::Price => doc.prices.contains_key(name),
        Kind::Override => doc.overrides.contains_key(name),
        Kind::Envoy => doc.envoy.is_some(),
        Kind::ExtProc => doc.ext_proc.is_some(),
        Kind::Global => doc.global.is_some(),
    }
}

/// Deletes document `name` of `kind` from `doc` (a single section: back to
/// its defaults), checked as `set` is. An override's blocks stay; a model
/// group a tier still limits is refused.
pub fn delete(doc: &mut ConfigDoc, kind: Kind, name: &str) -> Result<Change, AdminError> {
    let mut change = Change {
        field: kind.field(name),
        document: None,
        note: None,
        existed: exists(doc, kind, name),
    };
    let existed = match kind {
        Kind::Tier => doc.tiers.remove(name).is_some(),
        Kind::Model => doc.models.remove(name).is_some(),
        Kind::Price => doc.prices.remove(name).is_some(),
        Kind::Override => match doc.overrides.remove(name) {
            Some(old) => {
                let mut left = OverrideSection::default();
                keep_blocks(&old, &mut left);
                if !left.is_empty() {
                    change.note = Some(format!(
                        "tenant {name}'s limits are its tier's again; its block stays (lift it \
                         with `ctxbudget overrides unblock`, or DELETE \
                         /admin/v1/overrides/{name}/block)"
                    ));
                    change.document = Some(document(&left));
                    doc.overrides.insert(name.into(), left);
                }
                true
            }
            None => false,
        },
        // A single section always exists: deleting it restores its defaults.
        Kind::Envoy => {
            doc.envoy = None;
            true
        }
        Kind::ExtProc => {
            doc.ext_proc = None;
            true
        }
        Kind::Global => {
            doc.global = None;
            true
        }
    };
    if !existed {
        return Err(not_found(doc, kind, name));
    }
    if kind == Kind::Model
        && let Some(why) = still_used(doc, name)
    {
        return Err(AdminError::Invalid(why));
    }
    check_whole(doc)?;
    Ok(change)
}

/// Validates `doc` as the replicas will load it.
pub fn check_whole(doc: &ConfigDoc) -> Result<(), AdminError> {
    build_limits(doc.sections(), doc.version)
        .map(|_| ())
        .map_err(|e| AdminError::Invalid(format!("{e}; nothing was written")))
}

/// Carries `old`'s blocks into `new` where `new` names none of its own.
pub fn keep_blocks(old: &OverrideSection, new: &mut OverrideSection) {
    if new.blocked.is_none() {
        new.blocked.clone_from(&old.blocked);
    }
    for (user, reason) in &old.blocked_users {
        new.blocked_users
            .entry(user.clone())
            .or_insert_with(|| reason.clone());
    }
}

/// Why group `name` may not be deleted: the tiers that still limit it, and
/// what to do about it; `None` when no tier does.
pub fn still_used(doc: &ConfigDoc, name: &str) -> Option<String> {
    let paths = users_of(doc, name);
    let mut tiers: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.strip_prefix("tiers.")?.split('.').next())
        .collect();
    tiers.dedup();
    let (which, how) = match tiers.as_slice() {
        [] => return None,
        [one] => (
            format!("tier {one}"),
            format!(
                "`ctxbudget tiers get {one} > {one}.toml`, delete them, `ctxbudget tiers set {one} {one}.toml`"
            ),
        ),
        many => (
            format!("tiers {}", many.join(", ")),
            "`ctxbudget tiers get TIER > t.toml`, delete them, `ctxbudget tiers set TIER t.toml`"
                .to_string(),
        ),
    };
    Some(format!(
        "model group {name} is still limited by {which} ({}); remove those sections first \
         ({how}), then delete the group; nothing was written",
        paths.join(", ")
    ))
}

/// The sections of tiers that set limits for group `name`, as paths
/// (`tiers.pro.models.gpt-4o`).
pub fn users_of(doc: &ConfigDoc, name: &str) -> Vec<String> {
    let mut users = Vec::new();
    for (tier, t) in &doc.tiers {
        if t.models.contains_key(name) {
            users.push(format!("tiers.{tier}.models.{name}"));
        }
        if t.shadow
            .as_ref()
            .is_some_and(|s| s.models.contains_key(name))
        {
            users.push(format!("tiers.{tier}.shadow.models.{name}"));
        }
    }
    users
}

/// A section as a JSON value.
fn json<T: Serialize>(section: &T) -> Value {
    serde_json::to_value(section).unwrap_or(Value::Null)
}
