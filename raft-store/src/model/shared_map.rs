//! An ordered map whose values its clones share until one of them changes a value. Cloning it
//! (a snapshot's copy of the state, taken under the state's lock while nothing can be applied)
//! copies keys and pointers, not values; the first change to a shared value copies that value
//! alone (`Arc::make_mut`). Reads look like a `BTreeMap<K, V>`'s, and it is serialized as one.

use std::borrow::Borrow;
use std::collections::{BTreeMap, btree_map};
use std::ops::{Index, RangeBounds};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedMap<K, V>(BTreeMap<K, Arc<V>>);

impl<K, V> Default for SharedMap<K, V> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K: Ord, V: Clone> SharedMap<K, V> {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.0.get(key).map(Arc::as_ref)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.contains_key(key)
    }

    /// The value to change in place: copied first if a clone of the map still shares it.
    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.0.get_mut(key).map(Arc::make_mut)
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0
            .insert(key, Arc::new(value))
            .map(Arc::unwrap_or_clone)
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.0.remove(key).map(Arc::unwrap_or_clone)
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.0.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.0.values().map(Arc::as_ref)
    }

    /// Every value to change in place (each shared one copied first).
    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.0.values_mut().map(Arc::make_mut)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.into_iter()
    }

    pub fn range<R: RangeBounds<K>>(&self, range: R) -> impl DoubleEndedIterator<Item = (&K, &V)> {
        self.0.range(range).map(|(k, v)| (k, v.as_ref()))
    }
}

impl<K: Ord, V> Index<&K> for SharedMap<K, V> {
    type Output = V;

    fn index(&self, key: &K) -> &V {
        &self.0[key]
    }
}

type Entry<'a, K, V> = (&'a K, &'a V);

impl<'a, K, V> IntoIterator for &'a SharedMap<K, V> {
    type Item = Entry<'a, K, V>;
    type IntoIter =
        std::iter::Map<btree_map::Iter<'a, K, Arc<V>>, fn(Entry<'a, K, Arc<V>>) -> Entry<'a, K, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v.as_ref()))
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SharedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
    }
}

impl<K: Ord, V> Extend<(K, V)> for SharedMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        self.0
            .extend(iter.into_iter().map(|(k, v)| (k, Arc::new(v))));
    }
}

impl<K: Serialize, V: Serialize> Serialize for SharedMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v.as_ref())))
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for SharedMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<K, V>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_values_until_one_side_changes_one() {
        let mut map: SharedMap<u64, String> = [(1, "a".to_owned()), (2, "b".to_owned())]
            .into_iter()
            .collect();
        let copy = map.clone();
        assert!(std::ptr::eq(
            map.get(&1).expect("1"),
            copy.get(&1).expect("1")
        ));
        map.get_mut(&1).expect("1").push('!');
        assert_eq!((map[&1].as_str(), copy[&1].as_str()), ("a!", "a"));
        assert!(std::ptr::eq(
            map.get(&2).expect("2"),
            copy.get(&2).expect("2")
        ));
        assert_eq!(map.remove(&2).as_deref(), Some("b"));
        assert_eq!(copy.len(), 2);
        for v in map.values_mut() {
            v.push('?');
        }
        assert_eq!(copy[&1], "a", "the copy never sees a change");
    }

    #[test]
    fn it_reads_and_writes_as_the_map_it_replaced() {
        let plain = BTreeMap::from([(3_u64, "x".to_owned()), (1, "y".to_owned())]);
        let shared: SharedMap<u64, String> = plain.clone().into_iter().collect();
        let json = serde_json::to_string(&shared).expect("encode");
        assert_eq!(json, serde_json::to_string(&plain).expect("encode"));
        let back: SharedMap<u64, String> = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, shared);
        let keys: Vec<u64> = back.keys().copied().collect();
        assert_eq!(keys, [1, 3]);
        assert_eq!(back.range(2..).count(), 1);
    }
}
