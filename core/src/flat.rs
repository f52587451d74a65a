//! [`FlatMap`]: a map kept as one sorted `Vec` of pairs, for the small maps a model holds by the
//! hundred thousand (a module's env and files, a summary's fields). A `BTreeMap` allocates a
//! node of eleven slots for its first entry (540 bytes for `String` pairs); a `FlatMap` of one
//! entry allocates exactly one pair (decision 0289). Lookups are binary searches; an insert
//! moves the tail, which for a handful of entries is cheaper than a tree. The pairs are a boxed
//! slice, not a `Vec`: no spare capacity and 16 bytes inline instead of 24, which a send
//! summary's module, with six of these maps, pays ten times per machine (decision 0337).
//!
//! It serializes as a map, entry by entry in key order, exactly as a `BTreeMap` does: bincode
//! bytes, digests and JSON are unchanged.

use std::borrow::Borrow;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A map of few entries, sorted by key, each key once.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlatMap<K, V> {
    entries: Box<[(K, V)]>,
}

impl<K, V> Default for FlatMap<K, V> {
    fn default() -> Self {
        FlatMap {
            entries: Box::default(),
        }
    }
}

impl<K: Ord, V> FlatMap<K, V> {
    pub fn new() -> Self {
        FlatMap::default()
    }

    fn find<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// Sets `key` to `value`; the value it had, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                let mut entries = std::mem::take(&mut self.entries).into_vec();
                entries.insert(at, (key, value));
                self.entries = entries.into_boxed_slice();
                None
            }
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).ok().map(|at| &self.entries[at].1)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).ok().map(|at| &mut self.entries[at].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).is_ok()
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let at = self.find(key).ok()?;
        let mut entries = std::mem::take(&mut self.entries).into_vec();
        let (_, value) = entries.remove(at);
        self.entries = entries.into_boxed_slice();
        Some(value)
    }
}

impl<K, V> FlatMap<K, V> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entries in key order, values writable (keys are not: the order would break).
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + ExactSizeIterator {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.entries.iter_mut().map(|(_, v)| v)
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for FlatMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for FlatMap<K, V> {
    /// As `BTreeMap` does: sorted by key, a later entry of a key replacing an earlier one.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        let mut entries: Vec<(K, V)> = pairs.into_iter().collect();
        // Stable: among equal keys the later entry stays last, and is the one kept below.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match kept.last_mut() {
                Some(last) if last.0 == k => last.1 = v,
                _ => kept.push((k, v)),
            }
        }
        FlatMap {
            entries: kept.into_boxed_slice(),
        }
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for FlatMap<K, V> {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for FlatMap<K, V> {
    type Output = V;

    /// As `BTreeMap`'s: panics when the key is missing (tests; code uses `get`).
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(v) => v,
            None => panic!("no entry for the key in a FlatMap"),
        }
    }
}

impl<K: Ord, V> Extend<(K, V)> for FlatMap<K, V> {
    /// As `BTreeMap`'s: a pair of a key already held replaces its value. One allocation for
    /// the whole extension, not one per pair.
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, pairs: I) {
        let held = std::mem::take(&mut self.entries).into_vec();
        *self = held.into_iter().chain(pairs).collect();
    }
}

impl<K, V> IntoIterator for FlatMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_vec().into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a FlatMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        fn pair<K, V>((k, v): &(K, V)) -> (&K, &V) {
            (k, v)
        }
        self.entries.iter().map(pair)
    }
}

impl<K: Serialize, V: Serialize> Serialize for FlatMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (k, v) in self.entries.iter() {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Deserialize<'de> for FlatMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<K, V>(std::marker::PhantomData<(K, V)>);

        impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for Entries<K, V> {
            type Value = FlatMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the input: trust it only up to a small bound.
                let hint = access.size_hint().unwrap_or(0).min(flat_hint_max);
                let mut pairs = Vec::with_capacity(hint);
                while let Some(pair) = access.next_entry()? {
                    pairs.push(pair);
                }
                Ok(pairs.into_iter().collect())
            }
        }

        deserializer.deserialize_map(Entries(std::marker::PhantomData))
    }
}

/// The most entries a decoded map's length may reserve room for before they arrive.
const flat_hint_max: usize = 4096;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::FlatMap;

    fn pairs() -> Vec<(String, String)> {
        ["b", "a", "c", "a"]
            .iter()
            .enumerate()
            .map(|(i, k)| (k.to_string(), i.to_string()))
            .collect()
    }

    #[test]
    fn flat_map_holds_what_a_btreemap_holds_in_the_same_order() {
        let flat: FlatMap<String, String> = pairs().into_iter().collect();
        let tree: BTreeMap<String, String> = pairs().into_iter().collect();
        assert!(flat.iter().eq(tree.iter()), "{flat:?} against {tree:?}");
        let mut flat = flat;
        let mut tree = tree;
        assert_eq!(
            flat.insert("aa".into(), "x".into()),
            tree.insert("aa".into(), "x".into())
        );
        assert_eq!(
            flat.insert("a".into(), "y".into()),
            tree.insert("a".into(), "y".into())
        );
        assert_eq!(flat.remove("b"), tree.remove("b"));
        assert_eq!(flat.remove("zz"), tree.remove("zz"));
        assert_eq!(flat.get("a"), tree.get("a"));
        assert!(flat.iter().eq(tree.iter()));
        assert_eq!(flat.len(), tree.len());
        // Extending: a key held or repeated takes the last value given, as in the tree.
        let more = [("c", "1"), ("d", "2"), ("c", "3")].map(|(k, v)| (k.into(), v.into()));
        flat.extend(more.clone());
        tree.extend(more);
        assert!(flat.iter().eq(tree.iter()), "{flat:?} against {tree:?}");
    }

    #[test]
    fn flat_map_encodes_byte_for_byte_as_a_btreemap() {
        // Digests and stored rows are of the encoded bytes: the type may change, they may not.
        let flat: FlatMap<String, String> = pairs().into_iter().collect();
        let tree: BTreeMap<String, String> = pairs().into_iter().collect();
        let a = mesh_codec::encode("flat", &flat).expect("encode");
        let b = mesh_codec::encode("tree", &tree).expect("encode");
        assert_eq!(a, b);
        let back: FlatMap<String, String> = mesh_codec::decode("flat", &b).expect("decode");
        assert_eq!(back, flat);
    }

    #[test]
    fn flat_map_decodes_unsorted_and_repeated_keys_as_a_btreemap_does() {
        // A peer may send any order: the map is sorted, the last value of a key kept.
        let json = r#"{"b":"1","a":"2","b":"3"}"#;
        let flat: FlatMap<String, String> = serde_json::from_str(json).expect("json");
        let tree: BTreeMap<String, String> = serde_json::from_str(json).expect("json");
        assert!(flat.iter().eq(tree.iter()), "{flat:?} against {tree:?}");
    }
}
