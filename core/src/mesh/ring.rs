//! Ring order from measured bandwidth: a bottleneck travelling-salesman problem.
//!
//! A ring all-reduce is as fast as its slowest link, so the ring should maximise the bandwidth of
//! the slowest directed link `ring[i] -> ring[i + 1]` (PRIME solved the same problem from iperf
//! measurements). [`ring_order`] is exact (a Held-Karp style dynamic programme over subsets,
//! `O(2^n n^2)`) up to [`EXACT_MAX_NODES`] nodes and a heuristic above (greedy tours improved by
//! local search, then a binary search on the bottleneck with a budgeted Hamiltonian-cycle search
//! at each threshold). Both agree with brute force on every tested matrix of up to 8 nodes
//! (exact) and with the exact solver on every tested matrix of up to 14 (heuristic).
//!
//! Bandwidth comes from [`BandwidthMatrix`], which the coordinator fills from the members' probe
//! reports. A pair never measured takes the reverse direction's value if that is known, else the
//! smallest value measured among the nodes in question (a pessimistic guess, so measured fast
//! links are preferred to unknown ones), else 1.

use crate::ids::NodeId;
use std::collections::BTreeMap;

/// Largest ring solved exactly; above this [`ring_order`] uses the heuristic.
pub const EXACT_MAX_NODES: usize = 16;

/// Measured bandwidth between nodes, in bytes per second, per directed pair (sender, receiver).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BandwidthMatrix {
    entries: BTreeMap<(NodeId, NodeId), f64>,
}

impl BandwidthMatrix {
    /// An empty matrix.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the bandwidth from `from` to `to`. Values that are not finite and positive, and
    /// self-links, are ignored.
    pub fn set(&mut self, from: NodeId, to: NodeId, bytes_per_sec: f64) {
        if from != to && bytes_per_sec.is_finite() && bytes_per_sec > 0.0 {
            self.entries.insert((from, to), bytes_per_sec);
        }
    }

    /// The measured bandwidth from `from` to `to`, if any.
    pub fn get(&self, from: NodeId, to: NodeId) -> Option<f64> {
        self.entries.get(&(from, to)).copied()
    }

    /// Forgets every measurement to or from `node`.
    pub fn remove_node(&mut self, node: NodeId) {
        self.entries.retain(|&(a, b), _| a != node && b != node);
    }

    /// Number of measured directed pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing has been measured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The peers of `from` among `nodes` to which no bandwidth has been measured, in id order.
    pub fn unmeasured_from(&self, from: NodeId, nodes: &[NodeId]) -> Vec<NodeId> {
        nodes.iter().copied().filter(|&to| to != from && self.get(from, to).is_none()).collect()
    }

    /// The dense matrix over `nodes` (in the order given), with missing entries filled as the
    /// module documentation says. The diagonal is 0 and never used.
    pub fn dense(&self, nodes: &[NodeId]) -> Vec<Vec<f64>> {
        let mut fallback = f64::INFINITY;
        for &a in nodes {
            for &b in nodes {
                if let Some(v) = self.get(a, b) {
                    fallback = fallback.min(v);
                }
            }
        }
        if !fallback.is_finite() {
            fallback = 1.0;
        }
        nodes
            .iter()
            .map(|&a| {
                nodes
                    .iter()
                    .map(|&b| {
                        if a == b {
                            0.0
                        } else {
                            self.get(a, b).or_else(|| self.get(b, a)).unwrap_or(fallback)
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// The ring order of `nodes` that maximises the slowest link under `matrix`. The result is a
/// permutation of `nodes` (duplicates are removed first), starting with the smallest id; when the
/// order by id is optimal, it is returned as is, so unmeasured meshes get a stable ring.
pub fn ring_order(nodes: &[NodeId], matrix: &BandwidthMatrix) -> Vec<NodeId> {
    let mut nodes = nodes.to_vec();
    nodes.sort();
    nodes.dedup();
    let w = matrix.dense(&nodes);
    let order = solve(&w);
    order.into_iter().map(|i| nodes[i]).collect()
}

/// The slowest link of the directed cycle `cycle` under `w` (`w[a][b]` is the bandwidth from `a`
/// to `b`); infinity for a cycle of fewer than two nodes.
pub fn bottleneck(cycle: &[usize], w: &[Vec<f64>]) -> f64 {
    if cycle.len() < 2 {
        return f64::INFINITY;
    }
    let mut m = f64::INFINITY;
    for i in 0..cycle.len() {
        let a = cycle[i];
        let b = cycle[(i + 1) % cycle.len()];
        m = m.min(w[a][b]);
    }
    m
}

/// The best cycle over `0..w.len()`: exact up to [`EXACT_MAX_NODES`], heuristic above. Always a
/// permutation starting with 0; the identity when it is optimal (exact) or as good as the
/// heuristic's best.
pub fn solve(w: &[Vec<f64>]) -> Vec<usize> {
    let identity: Vec<usize> = (0..w.len()).collect();
    if bottleneck(&identity, w) >= upper_bound(w) {
        return identity; // optimal already (uniform bandwidth, for one): skip the search
    }
    if w.len() <= EXACT_MAX_NODES { solve_exact(w) } else { solve_heuristic(w) }
}

/// No cycle's slowest link is faster than a node's fastest outgoing or incoming link.
fn upper_bound(w: &[Vec<f64>]) -> f64 {
    let n = w.len();
    let mut ub = f64::INFINITY;
    for (i, row) in w.iter().enumerate() {
        let out = (0..n).filter(|&j| j != i).map(|j| row[j]).fold(f64::NEG_INFINITY, f64::max);
        let inc = (0..n).filter(|&j| j != i).map(|j| w[j][i]).fold(f64::NEG_INFINITY, f64::max);
        ub = ub.min(out).min(inc);
    }
    ub
}

fn canonical(w: &[Vec<f64>], cycle: Vec<usize>) -> Vec<usize> {
    let identity: Vec<usize> = (0..w.len()).collect();
    if bottleneck(&identity, w) >= bottleneck(&cycle, w) {
        return identity;
    }
    // Rotate so that node 0 comes first.
    let pos = cycle.iter().position(|&x| x == 0).unwrap_or(0);
    let mut out = cycle[pos..].to_vec();
    out.extend_from_slice(&cycle[..pos]);
    out
}

/// The exact bottleneck cycle by dynamic programming over subsets: `best[S][j]` is the widest
/// slowest link of a path that starts at node 0, visits exactly `S` (a subset of `1..n`) and ends
/// at `j`. `O(2^n n^2)` time and `O(2^n n)` memory: use for n up to about 16.
pub fn solve_exact(w: &[Vec<f64>]) -> Vec<usize> {
    let n = w.len();
    if n <= 2 {
        return (0..n).collect();
    }
    let m = n - 1; // nodes 1..n are bits 0..m
    let full = (1usize << m) - 1;
    let idx = |mask: usize, j: usize| mask * m + j;
    let mut best = vec![f64::NEG_INFINITY; (full + 1) * m];
    let mut parent = vec![u8::MAX; (full + 1) * m];
    for j in 0..m {
        best[idx(1 << j, j)] = w[0][j + 1];
    }
    for mask in 1..=full {
        for j in 0..m {
            if mask & (1 << j) == 0 {
                continue;
            }
            let cur = best[idx(mask, j)];
            if cur == f64::NEG_INFINITY {
                continue;
            }
            for k in 0..m {
                if mask & (1 << k) != 0 {
                    continue;
                }
                let next = mask | (1 << k);
                let v = cur.min(w[j + 1][k + 1]);
                if v > best[idx(next, k)] {
                    best[idx(next, k)] = v;
                    parent[idx(next, k)] = j as u8;
                }
            }
        }
    }
    let mut end = 0;
    let mut end_val = f64::NEG_INFINITY;
    for j in 0..m {
        let v = best[idx(full, j)].min(w[j + 1][0]);
        if v > end_val {
            end_val = v;
            end = j;
        }
    }
    let mut rev = Vec::with_capacity(n);
    let mut mask = full;
    let mut j = end;
    loop {
        rev.push(j + 1);
        let p = parent[idx(mask, j)];
        mask &= !(1 << j);
        if p == u8::MAX || mask == 0 {
            break;
        }
        j = p as usize;
    }
    rev.push(0);
    rev.reverse();
    canonical(w, rev)
}

/// Objective of a cycle: its slowest link, then how many links are that slow (fewer is better).
fn objective(cycle: &[usize], w: &[Vec<f64>]) -> (f64, usize) {
    let b = bottleneck(cycle, w);
    let n = cycle.len();
    let c = (0..n).filter(|&i| w[cycle[i]][cycle[(i + 1) % n]] <= b).count();
    (b, c)
}

fn better(a: (f64, usize), b: (f64, usize)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// A heuristic bottleneck cycle for large n. First the widest-next greedy tour from every start
/// and the identity, the best few improved by moving single nodes and swapping pairs while that
/// raises the slowest link or reduces the number of links that slow; then a binary search over
/// the faster link values for a threshold at which a Hamiltonian cycle of links at least that fast
/// is found by a budgeted depth-first search. Deterministic; tens of milliseconds at n = 128.
pub fn solve_heuristic(w: &[Vec<f64>]) -> Vec<usize> {
    let n = w.len();
    if n <= 3 {
        return solve_exact(w);
    }
    let mut best: Vec<usize> = (0..n).collect();
    let mut best_obj = objective(&best, w);
    let mut starts: Vec<Vec<usize>> = vec![(0..n).collect()];
    // Nearest-neighbour tours from every start: each step goes to the unused node of the fastest
    // link (the lowest index among equals). Each row's columns are sorted once by that order, so
    // a step skips only the used nodes at the front of its row, instead of scanning all n
    // (O(n^3) over the n starts: a second per ordering at a thousand members).
    let by_speed: Vec<Vec<usize>> = w.iter().map(|row| speed_order(row)).collect();
    for s in 0..n {
        let mut used = vec![false; n];
        let mut tour = vec![s];
        used[s] = true;
        let mut cur = s;
        for _ in 1..n {
            let nxt = nearest_unused(&by_speed[cur], &w[cur], &used);
            used[nxt] = true;
            tour.push(nxt);
            cur = nxt;
        }
        starts.push(tour);
    }
    // Improve the most promising starts only, to bound the cost.
    starts.sort_by(|a, b| {
        let (oa, ob) = (objective(a, w), objective(b, w));
        ob.0.total_cmp(&oa.0).then(oa.1.cmp(&ob.1))
    });
    starts.truncate(8);
    for tour in starts {
        let t = improve(tour, w);
        let o = objective(&t, w);
        if better(o, best_obj) {
            best = t;
            best_obj = o;
        }
    }
    // Then look for a cycle above that bottleneck: binary search on the threshold, each step a
    // budgeted search for a Hamiltonian cycle among the links at least that fast.
    let ub = upper_bound(w);
    let mut values: Vec<f64> = w
        .iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().enumerate().filter(move |(j, _)| *j != i).map(|(_, &v)| v))
        .filter(|&v| v > best_obj.0 && v <= ub)
        .collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    let (mut lo, mut hi) = (0usize, values.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        match hamiltonian_cycle(w, values[mid], HAMILTONIAN_BUDGET) {
            Some(c) => {
                best = c;
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    canonical(w, improve(best, w))
}

/// The columns of `row`, fastest first, the lower index first among equals, compared as a scan
/// with `>` compares (NaN is never greater, -0.0 equals 0.0).
fn speed_order(row: &[f64]) -> Vec<usize> {
    let key = |v: f64| if v.is_nan() { f64::NEG_INFINITY } else { v };
    let mut cols: Vec<usize> = (0..row.len()).collect();
    cols.sort_by(|&a, &b| {
        let by_value = key(row[b]).partial_cmp(&key(row[a]));
        by_value.unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b))
    });
    cols
}

/// The unused column a scan for the strictly largest value of `row` picks (the lowest index among
/// equals): the first unused one in `by_speed` order; `usize::MAX` when no unused value is
/// greater than `-inf` (NaN and `-inf` are never picked), as the scan leaves its initial choice.
fn nearest_unused(by_speed: &[usize], row: &[f64], used: &[bool]) -> usize {
    let first = by_speed.iter().copied().find(|&k| !used[k]);
    match first {
        Some(k) if row[k] > f64::NEG_INFINITY => k,
        _ => usize::MAX,
    }
}

/// Node expansions allowed to one [`hamiltonian_cycle`] search.
const HAMILTONIAN_BUDGET: usize = 50_000;

/// A directed Hamiltonian cycle using only links of at least `t`, by depth-first search from
/// node 0 that tries the candidates with the fewest onward links first (Warnsdorff's rule), or
/// `None` if none is found within `budget` expansions.
fn hamiltonian_cycle(w: &[Vec<f64>], t: f64, budget: usize) -> Option<Vec<usize>> {
    let n = w.len();
    let adj: Vec<Vec<usize>> =
        (0..n).map(|i| (0..n).filter(|&j| j != i && w[i][j] >= t).collect()).collect();
    let has_in = |j: usize| (0..n).any(|i| i != j && w[i][j] >= t);
    if adj.iter().any(Vec::is_empty) || !(0..n).all(has_in) {
        return None;
    }
    let mut path = vec![0usize];
    let mut used = vec![false; n];
    used[0] = true;
    // One iterator position per depth: the candidates of path[d], ordered.
    let order = |cur: usize, used: &[bool]| -> Vec<usize> {
        let mut c: Vec<(usize, usize)> = adj[cur]
            .iter()
            .copied()
            .filter(|&j| !used[j])
            .map(|j| (adj[j].iter().filter(|&&k| !used[k] || k == 0).count(), j))
            .collect();
        c.sort_unstable();
        c.into_iter().map(|(_, j)| j).collect()
    };
    let mut stack: Vec<(Vec<usize>, usize)> = vec![(order(0, &used), 0)];
    let mut spent = 0;
    while let Some((cands, next)) = stack.last_mut() {
        if path.len() == n {
            if w[path[n - 1]][0] >= t {
                return Some(path);
            }
        } else if *next < cands.len() {
            let j = cands[*next];
            *next += 1;
            spent += 1;
            if spent > budget {
                return None;
            }
            used[j] = true;
            path.push(j);
            let c = order(j, &used);
            stack.push((c, 0));
            continue;
        }
        // Exhausted (or a full path that does not close): backtrack.
        stack.pop();
        if let Some(j) = path.pop() {
            if path.is_empty() {
                return None;
            }
            used[j] = false;
        }
    }
    None
}

/// Whether replacing the links `removed` by `added` improves a cycle whose objective is `obj`
/// (its slowest link and how many links are that slow). `O(1)`.
fn improves(obj: (f64, usize), removed: &[f64], added: &[f64]) -> bool {
    let (b, count) = obj;
    if added.iter().any(|&v| v < b) {
        return false;
    }
    let removed_at = removed.iter().filter(|&&v| v <= b).count();
    let added_at = added.iter().filter(|&&v| v <= b).count();
    let new_count = count - removed_at.min(count) + added_at;
    new_count < count
}

fn improve(mut tour: Vec<usize>, w: &[Vec<f64>]) -> Vec<usize> {
    let n = tour.len();
    let mut obj = objective(&tour, w);
    let at = |t: &[usize], k: usize| t[k % n];
    let max_passes = 4 * n * n;
    for _ in 0..max_passes {
        let mut found: Option<Vec<usize>> = None;
        // Node moves: take x = tour[i] out (p -> x -> q becomes p -> q) and put it between
        // a = tour[j] and b = tour[j + 1].
        'moves: for i in 0..n {
            let (p, x, q) = (at(&tour, i + n - 1), tour[i], at(&tour, i + 1));
            // Every move of x adds p -> q: when that link is below the slowest, none improves.
            if w[p][q] < obj.0 {
                continue;
            }
            for j in 0..n {
                if j == i || (j + 1) % n == i {
                    continue;
                }
                let (a, b) = (tour[j], at(&tour, j + 1));
                let removed = [w[p][x], w[x][q], w[a][b]];
                let added = [w[p][q], w[a][x], w[x][b]];
                if improves(obj, &removed, &added) {
                    let mut t = tour.clone();
                    t.remove(i);
                    let pos = t.iter().position(|&v| v == a).map_or(0, |k| k + 1);
                    t.insert(pos, x);
                    found = Some(t);
                    break 'moves;
                }
            }
        }
        if found.is_none() {
            'swaps: for i in 0..n {
                for j in i + 1..n {
                    let mut idx = [(i + n - 1) % n, i, (j + n - 1) % n, j];
                    idx.sort_unstable();
                    // The distinct positions, without a heap allocation per pair (a thousand
                    // members try half a million pairs per pass).
                    let mut edges = [0usize; 4];
                    let mut m = 0;
                    for k in idx {
                        if m == 0 || edges[m - 1] != k {
                            edges[m] = k;
                            m += 1;
                        }
                    }
                    let edges = &edges[..m];
                    let swapped = |k: usize| {
                        let k = k % n;
                        if k == i {
                            tour[j]
                        } else if k == j {
                            tour[i]
                        } else {
                            tour[k]
                        }
                    };
                    let mut added = [0f64; 4];
                    for (e, &k) in edges.iter().enumerate() {
                        added[e] = w[swapped(k)][swapped(k + 1)];
                    }
                    // A link added below the slowest: no improvement (as `improves` says first).
                    if added[..m].iter().any(|&v| v < obj.0) {
                        continue;
                    }
                    let mut removed = [0f64; 4];
                    for (e, &k) in edges.iter().enumerate() {
                        removed[e] = w[tour[k]][at(&tour, k + 1)];
                    }
                    if improves(obj, &removed[..m], &added[..m]) {
                        let mut t = tour.clone();
                        t.swap(i, j);
                        found = Some(t);
                        break 'swaps;
                    }
                }
            }
        }
        match found {
            Some(t) => {
                let o = objective(&t, w);
                debug_assert!(better(o, obj));
                tour = t;
                obj = o;
            }
            None => break,
        }
    }
    tour
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_matrix(rng: &mut ChaCha8Rng, n: usize, distinct: u32) -> Vec<Vec<f64>> {
        (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| if a == b { 0.0 } else { f64::from(rng.random_range(1..=distinct)) })
                    .collect()
            })
            .collect()
    }

    /// The step of a nearest-neighbour tour through sorted rows picks what a scan for the
    /// strictly largest value picks, on rows with ties, zeros of both signs and NaN.
    #[test]
    fn nearest_unused_picks_what_a_scan_picks() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let values = [0.0, -0.0, 1.0, 2.0, 2.0, 5.0, f64::NAN, f64::INFINITY];
        for _ in 0..2000 {
            let n = rng.random_range(2..12);
            let row: Vec<f64> = (0..n).map(|_| values[rng.random_range(0..values.len())]).collect();
            let used: Vec<bool> = (0..n).map(|_| rng.random_range(0..3) == 0).collect();
            let cols = speed_order(&row);
            let (mut scan, mut best) = (usize::MAX, f64::NEG_INFINITY);
            for (k, &u) in used.iter().enumerate() {
                if !u && row[k] > best {
                    best = row[k];
                    scan = k;
                }
            }
            assert_eq!(nearest_unused(&cols, &row, &used), scan, "{row:?} {used:?}");
        }
    }

    fn brute_force(w: &[Vec<f64>]) -> f64 {
        fn rec(w: &[Vec<f64>], path: &mut Vec<usize>, used: &mut [bool], best: &mut f64) {
            let n = w.len();
            if path.len() == n {
                *best = best.max(bottleneck(path, w));
                return;
            }
            for k in 1..n {
                if !used[k] {
                    used[k] = true;
                    path.push(k);
                    rec(w, path, used, best);
                    path.pop();
                    used[k] = false;
                }
            }
        }
        let n = w.len();
        if n < 2 {
            return f64::INFINITY;
        }
        let mut best = f64::NEG_INFINITY;
        let mut used = vec![false; n];
        used[0] = true;
        rec(w, &mut vec![0], &mut used, &mut best);
        best
    }

    fn is_permutation(c: &[usize], n: usize) -> bool {
        let mut s = c.to_vec();
        s.sort();
        s == (0..n).collect::<Vec<_>>()
    }

    /// reference.md test case 11: the exact solver equals brute force for every n <= 8.
    #[test]
    fn exact_equals_brute_force_up_to_8() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for n in 1..=8 {
            for case in 0..60 {
                // Few distinct values make many ties; many make them rare.
                let distinct = if case % 2 == 0 { 4 } else { 1000 };
                let w = random_matrix(&mut rng, n, distinct);
                let c = solve_exact(&w);
                assert!(is_permutation(&c, n), "n={n}: {c:?}");
                assert_eq!(bottleneck(&c, &w), brute_force(&w), "n={n} case={case} w={w:?}");
                assert_eq!(c.first(), if n == 0 { None } else { Some(&0) });
            }
        }
    }

    #[test]
    fn sixteen_nodes_are_solved_exactly_and_agree_with_solve() {
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        let w = random_matrix(&mut rng, 16, 1000);
        let e = solve_exact(&w);
        assert!(is_permutation(&e, 16));
        assert_eq!(bottleneck(&solve(&w), &w), bottleneck(&e, &w));
        assert!(bottleneck(&e, &w) <= upper_bound(&w));
        assert!(bottleneck(&e, &w) >= bottleneck(&solve_heuristic(&w), &w));
    }

    #[test]
    fn the_slowest_link_is_avoided() {
        // Four nodes, all links 10 except 0->1 (1): the identity ring 0,1,2,3 uses 0->1, so the
        // solver must pick an order that does not.
        let mut w = vec![vec![10.0; 4]; 4];
        for (i, row) in w.iter_mut().enumerate() {
            row[i] = 0.0;
        }
        w[0][1] = 1.0;
        let c = solve_exact(&w);
        assert_eq!(bottleneck(&c, &w), 10.0);
        assert_ne!(c, vec![0, 1, 2, 3]);
    }

    #[test]
    fn uniform_bandwidth_gives_the_id_order() {
        let ids = [NodeId(7), NodeId(3), NodeId(5)];
        assert_eq!(
            ring_order(&ids, &BandwidthMatrix::new()),
            vec![NodeId(3), NodeId(5), NodeId(7)]
        );
        let w = vec![vec![1.0; 20]; 20];
        assert_eq!(solve(&w), (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn heuristic_is_a_permutation_and_usually_optimal() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut optimal = 0;
        let cases = 150;
        for case in 0..cases {
            let n = 4 + case % 7; // 4..=10
            let w = random_matrix(&mut rng, n, 50);
            let h = solve_heuristic(&w);
            assert!(is_permutation(&h, n));
            let e = bottleneck(&solve_exact(&w), &w);
            let hb = bottleneck(&h, &w);
            assert!(hb <= e);
            if hb == e {
                optimal += 1;
            }
        }
        // Measured: 150 of 150 with this seed at the time of writing; allow a little slack.
        assert!(optimal * 100 >= cases * 97, "heuristic optimal in {optimal}/{cases}");
    }

    #[test]
    fn heuristic_matches_the_exact_solver_at_14_nodes() {
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let mut optimal = 0;
        for _ in 0..10 {
            let w = random_matrix(&mut rng, 14, 10_000);
            let e = bottleneck(&solve_exact(&w), &w);
            let h = bottleneck(&solve_heuristic(&w), &w);
            assert!(h <= e);
            optimal += usize::from(h == e);
        }
        // Measured: 10 of 10 at the time of writing.
        assert!(optimal >= 9, "{optimal}/10");
    }

    #[test]
    fn heuristic_finds_a_planted_wide_cycle_in_a_large_mesh() {
        // n = 64: a hidden cycle of links in [900, 1000], every other link in [1, 899]. The best
        // bottleneck is at least 900; the heuristic must find a cycle that good.
        let n = 64;
        let mut rng = ChaCha8Rng::seed_from_u64(64);
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = rng.random_range(0..=i);
            perm.swap(i, j);
        }
        let mut w = random_matrix(&mut rng, n, 899);
        for i in 0..n {
            w[perm[i]][perm[(i + 1) % n]] = f64::from(rng.random_range(900..=1000u32));
        }
        let h = solve(&w);
        assert!(is_permutation(&h, n));
        assert!(bottleneck(&h, &w) >= 900.0, "bottleneck {}", bottleneck(&h, &w));
    }

    #[test]
    fn matrix_fallbacks() {
        let (a, b, c) = (NodeId(0), NodeId(1), NodeId(2));
        let mut m = BandwidthMatrix::new();
        m.set(a, b, 100.0);
        m.set(b, c, 50.0);
        m.set(a, a, 1.0); // ignored
        m.set(c, a, f64::NAN); // ignored
        assert_eq!(m.len(), 2);
        let d = m.dense(&[a, b, c]);
        assert_eq!(d[0][1], 100.0);
        assert_eq!(d[1][0], 100.0); // reverse direction
        assert_eq!(d[0][2], 50.0); // smallest known
        assert_eq!(m.unmeasured_from(a, &[a, b, c]), vec![c]);
        m.remove_node(b);
        assert!(m.is_empty());
    }
}
