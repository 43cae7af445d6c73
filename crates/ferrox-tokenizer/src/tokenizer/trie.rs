//! A byte trie over token texts, built once per tokenizer. WordPiece walks it for the
//! longest token at a position, the unigram Viterbi search for every token starting there.

use super::TokenId;

/// Marks a node that ends no key.
const NO_VALUE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    /// The children are `nodes[first_child..first_child + child_count]`, by ascending
    /// `label`.
    first_child: usize,
    value: u32,
    child_count: u16,
    /// The byte on the edge into this node (unused for the root).
    label: u8,
}

/// An immutable trie mapping byte strings to token ids. The children of each node are
/// stored contiguously, so a step is a search among siblings, and the sibling blocks are laid
/// out depth first, so a walk down the trie stays in nearby memory.
#[derive(Debug)]
pub(crate) struct ByteTrie {
    nodes: Vec<Node>,
    /// The root's children indexed by byte: the first step of every walk.
    root_children: Box<[u32; 256]>,
}

impl ByteTrie {
    /// Builds the trie from `(key, id)` pairs. When a key repeats, the pair given last wins.
    pub(crate) fn new<'a>(entries: impl IntoIterator<Item = (&'a [u8], TokenId)>) -> ByteTrie {
        let mut keys: Vec<(&[u8], TokenId)> = entries.into_iter().collect();
        // Stable sort, then keep the last of each run of equal keys.
        keys.sort_by(|a, b| a.0.cmp(b.0));
        let mut unique: Vec<(&[u8], TokenId)> = Vec::with_capacity(keys.len());
        for entry in keys {
            match unique.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => unique.push(entry),
            }
        }

        let empty = |label| Node {
            first_child: 0,
            value: NO_VALUE,
            child_count: 0,
            label,
        };
        let mut nodes = vec![empty(0)];
        // (node, range of `unique` below it, depth): every key of the range has the node's
        // path as prefix; sorted order puts the key equal to that path first.
        let mut pending = vec![(0usize, 0usize, unique.len(), 0usize)];
        while let Some((node, lo, hi, depth)) = pending.pop() {
            let mut i = lo;
            if i < hi && unique[i].0.len() == depth {
                nodes[node].value = unique[i].1;
                i += 1;
            }
            let first_child = nodes.len();
            while i < hi {
                let byte = unique[i].0[depth];
                let mut j = i + 1;
                while j < hi && unique[j].0[depth] == byte {
                    j += 1;
                }
                pending.push((nodes.len(), i, j, depth + 1));
                nodes.push(empty(byte));
                i = j;
            }
            nodes[node].first_child = first_child;
            // At most 256 children: one per byte value.
            nodes[node].child_count = (nodes.len() - first_child) as u16;
        }

        let mut root_children = Box::new([0u32; 256]);
        let root = nodes[0];
        for k in 0..usize::from(root.child_count) {
            // The root's children are nodes 1..=256.
            let child = root.first_child + k;
            root_children[usize::from(nodes[child].label)] = child as u32;
        }
        ByteTrie {
            nodes,
            root_children,
        }
    }

    /// The child of `node` along `byte`.
    #[inline]
    fn child(&self, node: usize, byte: u8) -> Option<usize> {
        if node == 0 {
            let child = self.root_children[usize::from(byte)];
            return (child != 0).then_some(child as usize);
        }
        let n = self.nodes[node];
        let start = n.first_child;
        let siblings = &self.nodes[start..start + usize::from(n.child_count)];
        siblings
            .binary_search_by_key(&byte, |s| s.label)
            .ok()
            .map(|k| start + k)
    }

    /// Every key that is a prefix of `bytes`, shortest first, as `(length, id)`.
    pub(crate) fn prefixes<'a>(&'a self, bytes: &'a [u8]) -> Prefixes<'a> {
        Prefixes {
            trie: self,
            bytes,
            node: 0,
            depth: 0,
        }
    }

    /// The longest key that is a prefix of `bytes`, as `(length, id)`.
    pub(crate) fn longest_prefix(&self, bytes: &[u8]) -> Option<(usize, TokenId)> {
        self.prefixes(bytes).last()
    }

    /// How many leading bytes of `bytes` lie on a path of the trie, whether or not a key
    /// ends there.
    pub(crate) fn path_len(&self, bytes: &[u8]) -> usize {
        let mut node = 0;
        for (depth, &byte) in bytes.iter().enumerate() {
            match self.child(node, byte) {
                Some(next) => node = next,
                None => return depth,
            }
        }
        bytes.len()
    }
}

/// Iterator returned by [`ByteTrie::prefixes`].
pub(crate) struct Prefixes<'a> {
    trie: &'a ByteTrie,
    bytes: &'a [u8],
    node: usize,
    depth: usize,
}

impl Iterator for Prefixes<'_> {
    type Item = (usize, TokenId);

    fn next(&mut self) -> Option<(usize, TokenId)> {
        while let Some(&byte) = self.bytes.get(self.depth) {
            let Some(next) = self.trie.child(self.node, byte) else {
                self.depth = self.bytes.len();
                return None;
            };
            self.node = next;
            self.depth += 1;
            let value = self.trie.nodes[next].value;
            if value != NO_VALUE {
                return Some((self.depth, value));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[(&str, TokenId)]) -> ByteTrie {
        ByteTrie::new(keys.iter().map(|&(k, id)| (k.as_bytes(), id)))
    }

    #[test]
    fn finds_every_prefix_in_order() {
        let t = trie(&[("a", 1), ("abc", 2), ("ab", 3), ("b", 4), ("abcd", 5)]);
        let found: Vec<_> = t.prefixes(b"abcx").collect();
        assert_eq!(found, vec![(1, 1), (2, 3), (3, 2)]);
        assert_eq!(t.longest_prefix(b"abcd"), Some((4, 5)));
        assert_eq!(t.longest_prefix(b"x"), None);
        assert_eq!(t.longest_prefix(b""), None);
    }

    #[test]
    fn last_duplicate_wins() {
        let t = trie(&[("k", 1), ("k", 2), ("j", 3)]);
        assert_eq!(t.longest_prefix(b"k"), Some((1, 2)));
    }

    #[test]
    fn path_len_ignores_values() {
        let t = trie(&[("<abc>", 1)]);
        assert_eq!(t.path_len(b"<abx"), 3);
        assert_eq!(t.path_len(b"x"), 0);
        assert_eq!(t.path_len(b"<abc>d"), 5);
    }

    #[test]
    fn handles_all_byte_values() {
        let keys: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![0xff, b]).collect();
        let t = ByteTrie::new(
            keys.iter()
                .enumerate()
                .map(|(i, k)| (k.as_slice(), i as TokenId)),
        );
        for b in 0..=255u8 {
            assert_eq!(t.longest_prefix(&[0xff, b, 0]), Some((2, TokenId::from(b))));
        }
    }
}
