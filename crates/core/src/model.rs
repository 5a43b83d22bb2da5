//! Model groups: the upstream account's per-model limits. A group names the
//! models it covers with glob patterns, the model's context window, whether
//! cached prompt tokens count toward input-token limits, and its global limits
//! (tiers add tenant and user limits per group). Here too: the glob rules —
//! matching a model and telling whether two patterns can ever match the same
//! model, which makes two groups overlap — and each group's bucket tag.

use super::digest::Fnv;
use super::tier::{LevelLimits, LimitsError, MAX_COUNT, is_tier_name};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest glob pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 256;
/// Most patterns one group may list.
pub const MAX_PATTERNS: usize = 64;
/// Bucket tags are below this: a tag × 10⁸ stays far below 2⁵³, where doubles
/// (the scripts' numbers) stop being exact integers.
pub const TAG_SPACE: u32 = 1 << 24;

/// One model group as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelGroup {
    /// The group's name: `[models.<name>]`.
    pub name: String,
    /// Glob patterns on the request's model (`*` any run, `?` one character).
    pub patterns: Vec<String>,
    /// Prompt + output may not exceed it; `None`: only the tier's max context.
    pub context_window: Option<u64>,
    /// False: cached prompt tokens do not count toward `input_tokens` limits
    /// at Commit (Anthropic's rule).
    pub cached_input_counts: bool,
    /// Limits of this group's traffic over the whole upstream account.
    pub global: LevelLimits,
}

impl ModelGroup {
    /// The group's bucket tag: set in the ids of its buckets, so they can
    /// share a level's key with the all-model buckets (tag 0).
    pub fn tag(&self) -> u32 {
        group_tag(&self.name)
    }

    /// True when `model` is one of this group's.
    pub fn matches(&self, model: &str) -> bool {
        self.patterns.iter().any(|p| glob_match(p, model))
    }

    /// Checks the group's own rules; `path` prefixes field names in errors.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        if !is_tier_name(&self.name) {
            return Err(LimitsError::new(
                path.to_string(),
                format!(
                    "model group name {:?} must be 1-64 characters of a-z, A-Z, 0-9, '-', '_' or '.'",
                    self.name
                ),
            ));
        }
        if self.patterns.is_empty() || self.patterns.len() > MAX_PATTERNS {
            return Err(LimitsError::new(
                format!("{path}.match"),
                format!(
                    "list 1 to {MAX_PATTERNS} glob patterns, e.g. [\"gpt-4o\", \"gpt-4o-2024-*\"]"
                ),
            ));
        }
        for (i, p) in self.patterns.iter().enumerate() {
            if p.is_empty() || p.len() > MAX_PATTERN_BYTES || p.chars().any(char::is_control) {
                return Err(LimitsError::new(
                    format!("{path}.match[{i}]"),
                    format!(
                        "a pattern is 1-{MAX_PATTERN_BYTES} bytes without control characters, got {p:?}"
                    ),
                ));
            }
        }
        if let Some(w) = self.context_window
            && (w == 0 || w > MAX_COUNT)
        {
            return Err(LimitsError::new(
                format!("{path}.context_window"),
                format!("must be between 1 and {MAX_COUNT}, got {w}"),
            ));
        }
        self.global.validate(&format!("{path}.global"))
    }
}

/// The model groups of a configuration, by name.
pub type ModelGroups = BTreeMap<String, Arc<ModelGroup>>;

/// The group `model` belongs to, if any. Groups never overlap (checked by
/// [`check_groups`]), so at most one matches.
pub fn group_of<'a>(groups: &'a ModelGroups, model: &str) -> Option<&'a Arc<ModelGroup>> {
    groups.values().find(|g| g.matches(model))
}

/// Checks every group and that no model could belong to two of them, nor two
/// groups share a bucket tag.
pub fn check_groups(groups: &ModelGroups) -> Result<(), LimitsError> {
    for (name, g) in groups {
        g.validate(&format!("models.{name}"))?;
    }
    let all: Vec<&Arc<ModelGroup>> = groups.values().collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.tag() == b.tag() {
                return Err(LimitsError::new(
                    format!("models.{}", b.name),
                    format!(
                        "the names {:?} and {:?} hash to the same bucket tag; rename one",
                        a.name, b.name
                    ),
                ));
            }
            for pa in &a.patterns {
                if let Some(pb) = b.patterns.iter().find(|pb| globs_overlap(pa, pb)) {
                    return Err(LimitsError::new(
                        format!("models.{}.match", b.name),
                        format!(
                            "pattern {pb:?} of group {} and pattern {pa:?} of group {} can match \
                             the same model; a model may belong to one group only",
                            b.name, a.name
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A group name's bucket tag: 1 to [`TAG_SPACE`] − 1 (0 is the all-model buckets').
pub fn group_tag(name: &str) -> u32 {
    let mut h = Fnv::new();
    h.write(name.as_bytes());
    (h.finish() % u64::from(TAG_SPACE - 1)) as u32 + 1
}

/// True when `text` matches `pattern`: `*` matches any run of characters
/// (none included), `?` exactly one, anything else itself. Every reserve
/// matches its model against the groups' patterns, so ASCII (model names in
/// practice) is matched on bytes, without allocating.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    if pattern.is_ascii() && text.is_ascii() {
        return match_units(pattern.as_bytes(), text.as_bytes(), b'*', b'?');
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    match_units(&p, &t, '*', '?')
}

/// The classic two-pointer glob match with one backtrack point per star,
/// over bytes or characters.
fn match_units<T: PartialEq + Copy>(p: &[T], t: &[T], any_run: T, any_one: T) -> bool {
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && p[i] == any_run {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && (p[i] == any_one || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == any_run)
}

/// True when some text matches both patterns: the two glob languages
/// intersect. Dynamic programming over positions (i in `a`, j in `b`): a
/// star may take the other side's next element (a character, a `?`, or what
/// the other star produces) or end.
pub fn globs_overlap(a: &str, b: &str) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let (n, m) = (a.len(), b.len());
    // can[i][j]: the suffixes a[i..] and b[j..] share a match.
    let mut can = vec![vec![false; m + 1]; n + 1];
    for i in (0..=n).rev() {
        for j in (0..=m).rev() {
            can[i][j] = match (a.get(i), b.get(j)) {
                (None, None) => true,
                (Some('*'), _) if can[i + 1][j] => true,
                (_, Some('*')) if can[i][j + 1] => true,
                (Some('*'), Some(_)) => can[i][j + 1],
                (Some(_), Some('*')) => can[i + 1][j],
                (Some(&x), Some(&y)) => (x == y || x == '?' || y == '?') && can[i + 1][j + 1],
                _ => false,
            };
        }
    }
    can[0][0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_shells_do() {
        assert!(glob_match("gpt-4o", "gpt-4o"));
        assert!(!glob_match("gpt-4o", "gpt-4o-mini"));
        assert!(glob_match("gpt-4o-2024-*", "gpt-4o-2024-08-06"));
        assert!(glob_match("claude-*-4?", "claude-sonnet-45"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*b", "acbd"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(glob_match("modèle-?", "modèle-é"), "? is one character");
        assert!(!glob_match("modèle-??", "modèle-é"));
    }

    #[test]
    fn overlap_is_a_shared_match() {
        assert!(!globs_overlap("gpt-4o", "gpt-4o-mini"));
        assert!(!globs_overlap("gpt-4o-2024-*", "gpt-4o-mini*"));
        assert!(globs_overlap("gpt-4o*", "gpt-4o-mini"));
        assert!(globs_overlap("*-mini", "gpt-*"));
        assert!(globs_overlap("claude-?onnet", "claude-s*"));
        assert!(!globs_overlap("a*", "b*"));
        assert!(globs_overlap("*a", "a*"));
        assert!(!globs_overlap("a?", "a"));
    }

    #[test]
    fn overlap_agrees_with_matching_on_small_alphabets() {
        // Every pattern over {a, b, *, ?} up to 3 long against every text up
        // to 4 long: overlap holds exactly when some text matches both.
        let alphabet = ['a', 'b', '*', '?'];
        let mut patterns = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = patterns
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            patterns.extend(longer);
        }
        patterns.sort();
        patterns.dedup();
        let mut texts = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = texts
                .iter()
                .flat_map(|t| ['a', 'b'].iter().map(move |c| format!("{t}{c}")))
                .collect();
            texts.extend(longer);
        }
        for a in &patterns {
            for b in &patterns {
                let shared = texts.iter().any(|t| glob_match(a, t) && glob_match(b, t));
                // Texts up to 4 long witness any overlap of patterns up to 3 long.
                assert_eq!(globs_overlap(a, b), shared, "{a:?} vs {b:?}");
            }
        }
    }

    fn group(name: &str, patterns: &[&str]) -> Arc<ModelGroup> {
        Arc::new(ModelGroup {
            name: name.into(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            context_window: Some(1000),
            cached_input_counts: true,
            global: LevelLimits::default(),
        })
    }

    #[test]
    fn overlapping_groups_are_refused_naming_both_patterns() {
        let groups: ModelGroups = [
            ("a".to_string(), group("a", &["gpt-4o", "gpt-4o-2024-*"])),
            ("b".to_string(), group("b", &["gpt-4o-mini"])),
        ]
        .into();
        assert_eq!(check_groups(&groups), Ok(()));
        assert_eq!(group_of(&groups, "gpt-4o-mini").unwrap().name, "b");
        assert_eq!(group_of(&groups, "gpt-4o-2024-05-13").unwrap().name, "a");
        assert!(group_of(&groups, "o3").is_none());
        let mut bad = groups.clone();
        bad.insert("c".into(), group("c", &["gpt-*"]));
        let err = check_groups(&bad).unwrap_err();
        assert_eq!(err.field, "models.c.match");
        assert!(err.problem.contains("\"gpt-*\""), "{err}");
        assert!(err.problem.contains("\"gpt-4o\""), "{err}");
    }

    #[test]
    fn tags_are_nonzero_and_in_range() {
        for name in ["gpt-4o", "claude-sonnet", "x"] {
            let t = group_tag(name);
            assert!(t > 0 && t < TAG_SPACE);
        }
        assert_ne!(group_tag("gpt-4o"), group_tag("gpt-4o-mini"));
    }
}
