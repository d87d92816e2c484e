//! Comparing secrets (bearer tokens, digests) in constant time, so how long a wrong one
//! takes to refuse says nothing about the right one. Used by the API's auth, the scoped
//! tokens and `/mcp`.

/// Are `a` and `b` the same bytes? Constant-time in their contents.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
