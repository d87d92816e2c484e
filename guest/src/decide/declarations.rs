//! Detached-process declarations: how they are named in the records store, and
//! which of them belong to a container.

/// Record-name prefix of a declaration. The value is the container id it ran in.
pub const PREFIX: &str = "detached/";

/// A declared detached process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The substrate-assigned UUID.
    pub id: String,
    /// The container it was started in.
    pub container: String,
}

/// The record name of a declaration.
pub fn record_name(id: &str) -> String {
    format!("{PREFIX}{id}")
}

/// Parse a record (name, value) back into a declaration; `None` if it is not one.
pub fn parse(name: &str, value: &str) -> Option<Declaration> {
    let id = name.strip_prefix(PREFIX)?;
    Some(Declaration {
        id: id.to_string(),
        container: value.to_string(),
    })
}

/// Split declarations into those of `container` and stale ones of other containers.
///
/// A key has one live container at a time, so a declaration made in another
/// container names a process that no longer exists: it is stale and is reaped.
pub fn for_container(
    all: Vec<Declaration>,
    container: &str,
) -> (Vec<Declaration>, Vec<Declaration>) {
    all.into_iter().partition(|d| d.container == container)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, c: &str) -> Declaration {
        Declaration {
            id: id.into(),
            container: c.into(),
        }
    }

    #[test]
    fn declarations_split_by_container() {
        let rows: &[(&[Declaration], &str, &[&str], &[&str])] = &[
            // No declarations: nothing current, nothing stale.
            (&[], "c1", &[], &[]),
            // A declaration of this container is current.
            (&[d("a", "c1")], "c1", &["a"], &[]),
            // A declaration of an older container is stale.
            (&[d("a", "c0"), d("b", "c1")], "c1", &["b"], &["a"]),
        ];
        for (all, container, current, stale) in rows {
            let (c, s) = for_container(all.to_vec(), container);
            let ids = |v: Vec<Declaration>| v.into_iter().map(|d| d.id).collect::<Vec<_>>();
            assert_eq!(ids(c), *current, "current for {all:?}");
            assert_eq!(ids(s), *stale, "stale for {all:?}");
        }
    }

    #[test]
    fn record_names_round_trip() {
        let name = record_name("7d3c");
        assert_eq!(parse(&name, "c1"), Some(d("7d3c", "c1")));
        assert_eq!(parse("other/7d3c", "c1"), None);
    }
}
