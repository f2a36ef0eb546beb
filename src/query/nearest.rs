//! The known names nearest to a misspelled one, for "did you mean" hints.
//!
//! Edit distance (insertions, deletions, substitutions and swaps of neighbouring
//! characters) is twenty lines, so it is written here rather than taken from a crate.
//! Letters that differ only in ASCII case cost nothing, so `shop.order` finds
//! `Shop.Order`.

/// At most this many suggestions.
const MAX_SUGGESTIONS: usize = 3;

/// The known names within reach of `name`, nearest first, ties in the order given: those
/// at the smallest distance, if it is at most a third of the name's length (at least 1),
/// so that a short name is not "corrected" into an unrelated one.
pub(crate) fn nearest<'k>(name: &str, known: impl IntoIterator<Item = &'k str>) -> Vec<String> {
    let len = name.chars().count();
    let reach = (len / 3).max(1);
    let mut best: Vec<(usize, &str)> = known
        .into_iter()
        .filter(|k| *k != name)
        // The distance is at least the difference in length: most names are never compared.
        .filter(|k| k.chars().count().abs_diff(len) <= reach)
        .map(|k| (distance(name, k), k))
        .filter(|(d, _)| *d <= reach)
        .collect();
    best.sort_by_key(|(d, _)| *d);
    let Some(&(min, _)) = best.first() else {
        return Vec::new();
    };
    best.into_iter()
        .take_while(|(d, _)| *d == min)
        .take(MAX_SUGGESTIONS)
        .map(|(_, k)| k.to_string())
        .collect()
}

/// The edit distance between two names, counting characters: insertions, deletions,
/// substitutions and swaps of two neighbours (`nmae` is one edit from `name`), each
/// character edited once at most (optimal string alignment). ASCII case is ignored.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let same = |x: char, y: char| x.eq_ignore_ascii_case(&y);
    // `d[i][j]`: the distance between `a[..i]` and `b[..j]`.
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let substitute = d[i - 1][j - 1] + usize::from(!same(a[i - 1], b[j - 1]));
            let mut best = substitute.min(d[i - 1][j] + 1).min(d[i][j - 1] + 1);
            if i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1]) {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_edits_and_ignores_case() {
        assert_eq!(distance("Ordr", "Order"), 1);
        assert_eq!(distance("Shop.Shipmnt", "Shop.Shipment"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("shop.order", "Shop.Order"), 0);
        assert_eq!(distance("é", "e"), 1);
        assert_eq!(distance("nmae", "name"), 1);
        assert_eq!(distance("ca", "abc"), 3);
    }

    #[test]
    fn the_nearest_names_within_reach_are_suggested() {
        let known = ["Shop", "Shop.Order", "Shop.Shipment", "Customer"];
        assert_eq!(nearest("Shop.Ordr", known), ["Shop.Order"]);
        assert_eq!(nearest("Shop.Shipmnt", known), ["Shop.Shipment"]);
        // "Shp" is one edit from "Shop" and within reach of nothing else.
        assert_eq!(nearest("Shp", known), ["Shop"]);
        // Too far from everything: no suggestion rather than a wrong one.
        assert!(nearest("Invoice", known).is_empty());
        // Ties keep the order given, at most three.
        assert_eq!(
            nearest("ab", ["aa", "bb", "ac", "ad", "zz"]),
            ["aa", "bb", "ac"]
        );
    }
}
