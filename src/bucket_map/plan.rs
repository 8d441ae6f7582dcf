//! What a namespace's bucket map should hold: a pure function of the claims
//! (resources whose bucket is ready to be published), the other resources of
//! the namespace, the keys somebody else writes, and the size budget.
//!
//! Rules, in this order:
//! 1. A logical name that is already in the map stays with the resource that
//!    holds it, as long as that resource still claims it.
//! 2. Otherwise the oldest resource of the namespace that names it (by
//!    creation time, then name) holds it, whether or not it is Ready yet:
//!    a younger resource never takes a name an older one declared.
//! 3. A key that another field manager owns is never taken over.
//! 4. Entries are admitted oldest first while they fit in the budget.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

/// A resource whose bucket exists and is as declared: it asks for its entry.
/// A namespace's writer keeps one per resource for the resource's life and
/// files its uid, logical and physical names in several tables (claims,
/// entries written, verdicts): they are shared, one allocation each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The resource's `metadata.uid`.
    pub uid: Arc<str>,
    /// The resource's name (in the map's namespace).
    pub name: String,
    /// The logical bucket name (`spec.bucketName`): the map's key.
    pub logical: Arc<str>,
    /// The physical bucket name: the map's value.
    pub physical: Arc<str>,
    /// `metadata.creationTimestamp`: the oldest contender wins a logical name.
    pub created: Option<Timestamp>,
}

/// A resource of the namespace that names a logical bucket (Ready or not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contender {
    /// The resource's `metadata.uid`.
    pub uid: String,
    /// The resource's name.
    pub name: String,
    /// The logical bucket name it asks for.
    pub logical: String,
    /// `metadata.creationTimestamp`, which orders contenders for a name.
    pub created: Option<Timestamp>,
}

/// What became of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The entry is in the map.
    Published,
    /// Another resource holds the logical name, or another writer owns the key.
    Conflict(String),
    /// The map has no room left for the entry.
    TooLarge(String),
}

/// The map to write and the verdict of every claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub data: BTreeMap<String, String>,
    pub verdicts: HashMap<Arc<str>, Verdict>,
}

/// Everything the plan is computed from.
pub struct Inputs<'a> {
    pub claims: &'a BTreeMap<Arc<str>, Claim>,
    /// Claims refused earlier for want of room, waiting to be woken: they keep
    /// their place in the oldest-first order, so a younger claim cannot take
    /// the room an older one waits for.
    pub waiting: &'a BTreeMap<Arc<str>, Claim>,
    /// Logical name → uid of the resource whose entry the map holds now.
    pub incumbents: &'a BTreeMap<String, String>,
    pub contenders: &'a [Contender],
    /// Keys of the map owned by other field managers → who owns them.
    pub foreign_keys: &'a BTreeMap<String, String>,
    /// Bytes the map may use for our entries (see [`entry_cost`]).
    pub budget: usize,
}

/// What one entry costs in the stored ConfigMap, counted conservatively: the
/// key and value in `data`, the key again in the field manager's
/// `managedFields` entry, and framing.
pub fn entry_cost(logical: &str, physical: &str) -> usize {
    2 * logical.len() + physical.len() + 16
}

fn age_key<'a>(created: &'a Option<Timestamp>, name: &'a str) -> (Option<&'a Timestamp>, &'a str) {
    // `None` (never the case for stored objects) sorts first; names break ties.
    (created.as_ref(), name)
}

/// The uid holding each logical name that somebody claims.
fn holders(inputs: &Inputs<'_>) -> HashMap<String, (String, String)> {
    let mut holders: HashMap<String, (String, String)> = HashMap::new();
    let mut oldest: HashMap<&str, (Option<&Timestamp>, &str, &str)> = HashMap::new();
    let people = inputs
        .contenders
        .iter()
        .map(|c| (c.logical.as_str(), c.uid.as_str(), &c.name, &c.created))
        .chain(
            inputs
                .claims
                .values()
                .map(|c| (&*c.logical, &*c.uid, &c.name, &c.created)),
        );
    for (logical, uid, name, created) in people {
        let (when, by_name) = age_key(created, name);
        let entry = oldest.entry(logical).or_insert((when, by_name, uid));
        if (when, by_name) < (entry.0, entry.1) {
            *entry = (when, by_name, uid);
        }
    }
    for (logical, (_, name, uid)) in oldest {
        holders.insert(logical.to_owned(), (uid.to_owned(), name.to_owned()));
    }
    // An incumbent that still claims its name keeps it.
    for (logical, uid) in inputs.incumbents {
        if let Some(claim) = inputs.claims.get(uid.as_str())
            && *claim.logical == **logical
        {
            holders.insert(logical.clone(), (uid.clone(), claim.name.clone()));
        }
    }
    holders
}

/// Computes the map and the verdicts.
pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let holders = holders(inputs);
    let waiting = inputs
        .waiting
        .values()
        .filter(|c| !inputs.claims.contains_key(&*c.uid))
        .map(|c| (c, true));
    let mut claims: Vec<(&Claim, bool)> = inputs
        .claims
        .values()
        .map(|c| (c, false))
        .chain(waiting)
        .collect();
    claims
        .sort_by(|(a, _), (b, _)| age_key(&a.created, &a.name).cmp(&age_key(&b.created, &b.name)));
    let mut out = Plan::default();
    let mut used = 0usize;
    for (claim, is_waiting) in claims {
        let verdict = verdict(inputs, &holders, claim, &mut used);
        if is_waiting {
            // Its room (if any) is kept for it; it is decided when it claims again.
            continue;
        }
        if verdict == Verdict::Published {
            out.data
                .insert(claim.logical.to_string(), claim.physical.to_string());
        }
        out.verdicts.insert(claim.uid.clone(), verdict);
    }
    out
}

fn verdict(
    inputs: &Inputs<'_>,
    holders: &HashMap<String, (String, String)>,
    claim: &Claim,
    used: &mut usize,
) -> Verdict {
    let logical = &*claim.logical;
    if let Some((uid, name)) = holders.get(logical)
        && **uid != *claim.uid
    {
        return Verdict::Conflict(format!(
            "logical name {logical} belongs to Gcs {name}, which declared it first in this namespace; bucket {} is not published",
            claim.physical
        ));
    }
    if let Some(owner) = inputs.foreign_keys.get(logical) {
        return Verdict::Conflict(format!(
            "key {logical} of the bucket map is written by {owner}, not by bucketmap; bucket {} is not published",
            claim.physical
        ));
    }
    let cost = entry_cost(logical, &claim.physical);
    if *used + cost > inputs.budget {
        return Verdict::TooLarge(format!(
            "the namespace's bucket map is full ({} of {} bytes used by older entries); bucket {} is not published",
            *used, inputs.budget, claim.physical
        ));
    }
    *used += cost;
    Verdict::Published
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Option<Timestamp> {
        Timestamp::from_second(secs).ok()
    }

    fn claim(uid: &str, logical: &str, secs: i64) -> Claim {
        Claim {
            uid: uid.into(),
            name: format!("gcs-{uid}"),
            logical: logical.into(),
            physical: format!("{logical}-{uid}").into(),
            created: at(secs),
        }
    }

    fn contender(c: &Claim) -> Contender {
        Contender {
            uid: c.uid.to_string(),
            name: c.name.clone(),
            logical: c.logical.to_string(),
            created: c.created,
        }
    }

    fn run(claims: &[Claim], others: &[Contender], incumbents: &[(&str, &str)]) -> Plan {
        let claims: BTreeMap<_, _> = claims.iter().map(|c| (c.uid.clone(), c.clone())).collect();
        let incumbents = incumbents
            .iter()
            .map(|(l, u)| ((*l).to_owned(), (*u).to_owned()))
            .collect();
        plan(&Inputs {
            claims: &claims,
            waiting: &BTreeMap::new(),
            incumbents: &incumbents,
            contenders: others,
            foreign_keys: &BTreeMap::new(),
            budget: usize::MAX,
        })
    }

    #[test]
    fn the_older_resource_keeps_a_logical_name() {
        let old = claim("a", "photos", 10);
        let young = claim("b", "photos", 20);
        let p = run(&[young.clone(), old.clone()], &[], &[]);
        assert_eq!(
            p.data.get("photos").map(String::as_str),
            Some(&*old.physical)
        );
        assert_eq!(p.verdicts["a"], Verdict::Published);
        assert!(matches!(&p.verdicts["b"], Verdict::Conflict(m) if m.contains("gcs-a")));
    }

    #[test]
    fn an_older_resource_that_is_not_ready_yet_still_holds_its_name() {
        let young = claim("b", "photos", 20);
        let old = contender(&claim("a", "photos", 10));
        let p = run(&[young], &[old], &[]);
        assert!(p.data.is_empty());
        assert!(matches!(p.verdicts["b"], Verdict::Conflict(_)));
    }

    #[test]
    fn the_name_breaks_ties_within_one_second() {
        let p = run(
            &[claim("b", "photos", 10), claim("a", "photos", 10)],
            &[],
            &[],
        );
        assert_eq!(p.verdicts["a"], Verdict::Published);
    }

    #[test]
    fn an_incumbent_keeps_its_entry_against_an_older_newcomer() {
        let incumbent = claim("b", "photos", 10);
        let older = claim("a", "photos", 10);
        let p = run(&[incumbent, older], &[], &[("photos", "b")]);
        assert_eq!(p.verdicts["b"], Verdict::Published);
        assert!(matches!(p.verdicts["a"], Verdict::Conflict(_)));
    }

    #[test]
    fn keys_of_other_writers_are_never_taken() {
        let c = claim("a", "photos", 10);
        let claims = BTreeMap::from([(c.uid.clone(), c)]);
        let foreign = BTreeMap::from([("photos".to_owned(), "platform-team".to_owned())]);
        let p = plan(&Inputs {
            claims: &claims,
            waiting: &BTreeMap::new(),
            incumbents: &BTreeMap::new(),
            contenders: &[],
            foreign_keys: &foreign,
            budget: usize::MAX,
        });
        assert!(p.data.is_empty());
        assert!(matches!(&p.verdicts["a"], Verdict::Conflict(m) if m.contains("platform-team")));
    }

    #[test]
    fn entries_fit_oldest_first_up_to_the_budget_exactly() {
        let claims: Vec<Claim> = (0..5)
            .map(|i| claim(&format!("u{i}"), &format!("b{i}"), i))
            .collect();
        let cost = entry_cost(&claims[0].logical, &claims[0].physical);
        let map: BTreeMap<_, _> = claims.iter().map(|c| (c.uid.clone(), c.clone())).collect();
        let plan_with = |budget| {
            plan(&Inputs {
                claims: &map,
                waiting: &BTreeMap::new(),
                incumbents: &BTreeMap::new(),
                contenders: &[],
                foreign_keys: &BTreeMap::new(),
                budget,
            })
        };
        let exact = plan_with(3 * cost);
        assert_eq!(exact.data.len(), 3, "three entries fit exactly");
        assert_eq!(exact.verdicts["u2"], Verdict::Published);
        assert!(matches!(exact.verdicts["u3"], Verdict::TooLarge(_)));
        assert!(matches!(exact.verdicts["u4"], Verdict::TooLarge(_)));
        let one_short = plan_with(3 * cost - 1);
        assert_eq!(one_short.data.len(), 2, "one byte short: the third waits");
    }

    #[test]
    fn a_younger_claim_cannot_take_the_room_an_older_one_waits_for() {
        let older = claim("a", "older", 10);
        let younger = claim("b", "young", 20);
        let cost = entry_cost(&younger.logical, &younger.physical)
            .max(entry_cost(&older.logical, &older.physical));
        let claims = BTreeMap::from([(younger.uid.clone(), younger)]);
        let waiting = BTreeMap::from([(older.uid.clone(), older)]);
        let p = plan(&Inputs {
            claims: &claims,
            waiting: &waiting,
            incumbents: &BTreeMap::new(),
            contenders: &[],
            foreign_keys: &BTreeMap::new(),
            budget: cost,
        });
        assert!(p.data.is_empty());
        assert!(matches!(p.verdicts["b"], Verdict::TooLarge(_)));
        assert!(
            !p.verdicts.contains_key("a"),
            "the waiting claim is not decided now"
        );
    }

    #[test]
    fn every_claim_gets_exactly_one_verdict_and_the_map_is_a_function() {
        let claims: Vec<Claim> = (0..50)
            .map(|i| claim(&format!("u{i:02}"), &format!("name-{}", i % 7), i % 3))
            .collect();
        let p = run(&claims, &[], &[]);
        assert_eq!(p.verdicts.len(), 50);
        assert_eq!(p.data.len(), 7, "one entry per distinct logical name");
        let published = p
            .verdicts
            .values()
            .filter(|v| **v == Verdict::Published)
            .count();
        assert_eq!(published, 7);
    }
}
