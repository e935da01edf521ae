"""The campus tree: unique paths, path bottlenecks and all-pairs bottleneck sums (design §1, §3).

Vertices are numbered so that node i (a GPU machine, `node_ids[i]`) is vertex i; switches follow.
The tree is rooted at its centre, so the ancestor table has (height + 1) rows, which is 3-4 on a
three-tier campus: every query below is a handful of numpy passes over nodes, never a per-node loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import breadth_first_order

__all__ = ["BottleneckIndex", "CampusTree"]


def _bfs(adj: object, start: int) -> tuple[np.ndarray, np.ndarray]:
    order, pred = breadth_first_order(adj, start, directed=False, return_predecessors=True)
    return order, pred


def _depths(pred: np.ndarray, root: int) -> np.ndarray:
    """Depth of every vertex from a predecessor array (-9999 marks the root in scipy)."""
    n = pred.shape[0]
    parent = np.where(pred < 0, n, pred)
    parent_ext = np.r_[parent, n]
    depth = np.zeros(n + 1, dtype=np.int64)
    anc = parent_ext[:n].copy()
    # Count how many lifts reach the root; at most height iterations, each vectorised.
    alive = anc != n
    while alive.any():
        depth[:n] += alive
        anc = parent_ext[anc]
        alive = anc != n
    depth[root] = 0
    return depth[:n]


@dataclass(frozen=True, eq=False)
class CampusTree:
    """A campus network tree (design §1: access links, building switches, core); built once, reused."""

    link_ids: tuple[str, ...]
    node_ids: tuple[str, ...]  # endpoints that are nodes (GPU machines); others are switches
    vertex_ids: tuple[str, ...]  # node_ids followed by switch names
    parent: np.ndarray  # (V,) parent vertex, V (sentinel) for the root
    parent_link: np.ndarray  # (V,) link to the parent, -1 for the root
    depth: np.ndarray  # (V,)
    ancestors: np.ndarray  # (H+1, V+1): row k = k-th ancestor, V (sentinel) past the root

    @classmethod
    def from_links(
        cls,
        link_ids: Sequence[str],
        a: Sequence[str],
        b: Sequence[str],
        node_ids: Sequence[str],
    ) -> CampusTree:
        """Build the tree; raises ValueError naming the problem if the links do not form one tree."""
        link_ids, a, b, node_ids = tuple(link_ids), tuple(a), tuple(b), tuple(node_ids)
        if not (len(link_ids) == len(a) == len(b)):
            raise ValueError("link_ids, a and b must have the same length")
        if len(set(link_ids)) != len(link_ids):
            raise ValueError("duplicate link id")
        if len(set(node_ids)) != len(node_ids):
            raise ValueError("duplicate node id")
        if not node_ids:
            raise ValueError("no nodes")
        index = {v: i for i, v in enumerate(node_ids)}
        switches: list[str] = []
        for v in (*a, *b):
            if v not in index:
                index[v] = len(index)
                switches.append(v)
        n_v = len(index)
        ia = np.fromiter((index[v] for v in a), dtype=np.int64, count=len(a))
        ib = np.fromiter((index[v] for v in b), dtype=np.int64, count=len(b))
        if np.any(ia == ib):
            k = int(np.flatnonzero(ia == ib)[0])
            raise ValueError(f"link {link_ids[k]!r} joins {a[k]!r} to itself")
        adj = coo_matrix((np.ones(len(ia)), (ia, ib)), shape=(n_v, n_v)).tocsr()
        order, pred = _bfs(adj, 0)
        if order.shape[0] != n_v:
            reached = np.zeros(n_v, dtype=bool)
            reached[order] = True
            names = list(node_ids) + switches
            raise ValueError(
                f"not a tree: {names[int(np.argmin(reached))]!r} is not connected to {names[0]!r}"
            )
        if len(link_ids) != n_v - 1:
            raise ValueError(
                f"not a tree: the links form a cycle ({len(link_ids)} links for {n_v} endpoints, "
                f"a tree has {n_v - 1})"
            )
        # Root at the centre of the tree (middle of a longest path) to keep the ancestor table short.
        d0 = _depths(pred, 0)
        u = int(np.argmax(d0))
        _, pred_u = _bfs(adj, u)
        du = _depths(pred_u, u)
        v = int(np.argmax(du))
        path = [v]
        while path[-1] != u:
            path.append(int(pred_u[path[-1]]))
        root = path[len(path) // 2]
        _, pred_r = _bfs(adj, root)
        parent = np.where(pred_r < 0, n_v, pred_r).astype(np.int64)
        depth = _depths(pred_r, root)
        parent_link = np.full(n_v, -1, dtype=np.int64)
        child = np.where(parent[ib] == ia, ib, ia)
        parent_link[child] = np.arange(len(ia))
        height = int(depth.max()) if n_v else 0
        parent_ext = np.r_[parent, n_v]
        anc = np.empty((height + 1, n_v + 1), dtype=np.int64)
        anc[0] = np.arange(n_v + 1)
        for k in range(1, height + 1):
            anc[k] = parent_ext[anc[k - 1]]
        return cls(
            link_ids=link_ids,
            node_ids=node_ids,
            vertex_ids=tuple(node_ids) + tuple(switches),
            parent=parent,
            parent_link=parent_link,
            depth=depth,
            ancestors=anc,
        )

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_vertices(self) -> int:
        return len(self.vertex_ids)

    def path_links(self, src: int, dst: int) -> np.ndarray:
        """Link indices on the unique path src → dst (design §3), in order from src."""
        up: list[int] = []
        down: list[int] = []
        u, v = int(src), int(dst)
        while self.depth[u] > self.depth[v]:
            up.append(int(self.parent_link[u]))
            u = int(self.parent[u])
        while self.depth[v] > self.depth[u]:
            down.append(int(self.parent_link[v]))
            v = int(self.parent[v])
        while u != v:
            up.append(int(self.parent_link[u]))
            down.append(int(self.parent_link[v]))
            u, v = int(self.parent[u]), int(self.parent[v])
        return np.array(up + down[::-1], dtype=np.int64)

    def path_incidence(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All links of many paths at once: (pair index, link index) arrays, vectorised over pairs."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        lca = self._lca(src, dst)
        pairs: list[np.ndarray] = []
        links: list[np.ndarray] = []
        for end in (src, dst):
            steps = self.depth[end] - self.depth[lca]  # links between end and the LCA
            h = self.ancestors.shape[0] - 1
            ks = np.arange(h)[:, None]
            mask = ks < steps[None, :]
            verts = self.ancestors[:h, end]  # (H, n): vertex whose parent link is on the path
            kk, pp = np.nonzero(mask)
            pairs.append(pp)
            links.append(self.parent_link[verts[kk, pp]])
        return np.concatenate(pairs), np.concatenate(links)

    def _lca(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Lowest common ancestors of many (src, dst) pairs."""
        anc = self.ancestors
        h = anc.shape[0] - 1
        ds, dd = self.depth[src], self.depth[dst]
        lo = np.minimum(ds, dd)
        # Ancestor at each common depth t (0..H) of both ends; the LCA is the deepest equal one.
        t = np.arange(h + 1)[:, None]
        ks = np.clip(ds[None, :] - t, 0, h)
        kd = np.clip(dd[None, :] - t, 0, h)
        a_s = anc[ks, np.broadcast_to(src, ks.shape)] if src.size else np.zeros((h + 1, 0), np.int64)
        a_d = anc[kd, np.broadcast_to(dst, kd.shape)] if dst.size else np.zeros((h + 1, 0), np.int64)
        same = (a_s == a_d) & (t <= lo[None, :])
        deepest = h - np.argmax(same[::-1], axis=0)
        return a_s[deepest, np.arange(src.shape[0])]

    def _up_min(self, link_bytes_per_s: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """m[k, j] = min link bandwidth from vertex cols[j] up to its k-th ancestor (inf at k = 0)."""
        bw_ext = np.r_[np.asarray(link_bytes_per_s, dtype=float), np.inf]  # index -1 (root) reads inf
        bw_up = np.r_[bw_ext[self.parent_link], np.inf]
        anc = self.ancestors[:, cols]
        m = np.empty(anc.shape)
        m[0] = np.inf
        for k in range(1, anc.shape[0]):
            m[k] = np.minimum(m[k - 1], bw_up[anc[k - 1]])
        return m

    def bottleneck_bytes_per_s(
        self, link_bytes_per_s: np.ndarray, src: int, dst: np.ndarray
    ) -> np.ndarray:
        """bw_bot(src, d) = min available bandwidth over the path's links, for every d (design §3).

        inf where d == src (no link crossed).
        """
        link_bytes_per_s = np.asarray(link_bytes_per_s, dtype=float)
        dst = np.asarray(dst, dtype=np.int64)
        m_src = self._up_min(link_bytes_per_s, np.array([src]))[:, 0]
        m_dst = self._up_min(link_bytes_per_s, dst)
        return _bottleneck(self, src, dst, m_src, m_dst)


def _bottleneck(
    tree: CampusTree, src: int, dst: np.ndarray, m_src: np.ndarray, m_dst: np.ndarray
) -> np.ndarray:
    """Path bottleneck from precomputed up-min tables (rows = levels, m_dst columns follow dst)."""
    anc = tree.ancestors
    is_anc = np.zeros(anc.shape[1], dtype=bool)
    is_anc[anc[:, src]] = True
    is_anc[-1] = False
    a_d = anc[:, dst]
    k_d = np.argmax(is_anc[a_d], axis=0)  # first ancestor of d that is also one of src: the LCA
    cols = np.arange(dst.shape[0])
    lca = a_d[k_d, cols]
    k_s = tree.depth[src] - tree.depth[lca]
    return np.minimum(m_dst[k_d, cols], m_src[k_s])


@dataclass(frozen=True, eq=False)
class BottleneckIndex:
    """Per-period index of path bottlenecks between all node pairs (design §3, T̄_mig).

    For a node set S it answers Σ_{o∈S, o≠d} 1/bw_bot(d, o) for every d in O(n·H) — the quantity
    behind T̄_mig(d) — without forming the nxn pair matrix. For the pair (d, o) with lowest common
    ancestor w, bw_bot = min(m(d, w), m(o, w)) where m is the min bandwidth up to w; grouping every
    (o, ancestor w) pair by w, sorted by m(o, w), and subtracting the subtree of the child of w towards
    d turns the sum into prefix sums and one binary search per (d, level), all precomputed here.
    """

    tree: CampusTree
    link_bytes_per_s: np.ndarray
    up_min: np.ndarray  # (H+1, n_nodes): m(o, k-th ancestor of o)
    valid: np.ndarray  # (H+1, n_nodes) bool: the k-th ancestor exists
    # Group "A" (key = ancestor w) and "B" (key = child of w towards o), sorted by (key, m).
    a_node: np.ndarray
    a_val: np.ndarray
    b_node: np.ndarray
    b_val: np.ndarray
    # Per (level k, node d): slice [start, end) of its A/B group and the split point (< m(d, w)).
    qa: np.ndarray  # (3, H+1, n_nodes): start, split, end in A
    qb: np.ndarray  # (3, H+1, n_nodes): start, split, end in B (k >= 1)

    @classmethod
    def build(cls, tree: CampusTree, link_bytes_per_s: np.ndarray) -> BottleneckIndex:
        """Precompute for one control period's link bandwidths (vectorised; O(n·H log n))."""
        # A link with no available bandwidth is floored at 1 B/s: its transfers take "forever" but the
        # prefix sums below stay finite.
        link_bytes_per_s = np.maximum(np.asarray(link_bytes_per_s, dtype=float), 1.0)
        n = tree.n_nodes
        n_v = tree.n_vertices
        up = tree._up_min(link_bytes_per_s, np.arange(n))
        anc = tree.ancestors[:, :n]
        valid = anc != n_v
        h1 = anc.shape[0]
        kk, oo = np.nonzero(valid)
        vals = up[kk, oo]
        # Sort by value once, then stably by key: groups come out sorted by value. Ties in value need no
        # care: an entry equal to the query value contributes 1/a on either side of the split.
        by_val = np.argsort(vals, kind="stable")
        qa = np.zeros((3, h1, n), dtype=np.int64)
        qb = np.zeros((3, h1, n), dtype=np.int64)
        key_a = anc[kk, oo]
        order_a = by_val[np.argsort(key_a[by_val], kind="stable")]
        _fill_queries(qa, key_a[order_a], order_a, kk, oo)
        sel_b = np.flatnonzero(kk >= 1)
        key_b_all = np.full(kk.shape[0], -1, dtype=np.int64)
        key_b_all[sel_b] = anc[kk[sel_b] - 1, oo[sel_b]]
        by_val_b = by_val[kk[by_val] >= 1]
        order_b = by_val_b[np.argsort(key_b_all[by_val_b], kind="stable")]
        _fill_queries(qb, key_b_all[order_b], order_b, kk, oo)
        return cls(
            tree=tree,
            link_bytes_per_s=link_bytes_per_s,
            up_min=up,
            valid=valid,
            a_node=oo[order_a],
            a_val=vals[order_a],
            b_node=oo[order_b],
            b_val=vals[order_b],
            qa=qa,
            qb=qb,
        )

    def bottleneck_from(self, src: int, dst: np.ndarray) -> np.ndarray:
        """Same as CampusTree.bottleneck_bytes_per_s, from the precomputed tables."""
        dst = np.asarray(dst, dtype=np.int64)
        return _bottleneck(self.tree, src, dst, self.up_min[:, src], self.up_min[:, dst])

    def inverse_bottleneck_sums(self, members: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Σ_{o ∈ members, o ≠ d} 1/bw_bot(d, o) for each d in dst (members: bool per node)."""
        members = np.asarray(members, dtype=bool)
        dst = np.asarray(dst, dtype=np.int64)
        total = np.zeros(dst.shape[0])
        for node, val, q, sign, k0 in (
            (self.a_node, self.a_val, self.qa, 1.0, 0),
            (self.b_node, self.b_val, self.qb, -1.0, 1),
        ):
            s = members[node]
            with np.errstate(divide="ignore"):
                inv = np.where(s, 1.0 / val, 0.0)
            cnt = np.r_[0, np.cumsum(s)]
            csum = np.r_[0.0, np.cumsum(inv)]
            start, split, end = q[0][k0:, dst], q[1][k0:, dst], q[2][k0:, dst]
            a = self.up_min[k0:, dst]
            ok = self.valid[k0:, dst]
            lt_sum = csum[split] - csum[start]
            ge_cnt = (cnt[end] - cnt[start]) - (cnt[split] - cnt[start])
            with np.errstate(divide="ignore", invalid="ignore"):
                part = lt_sum + np.where(ge_cnt > 0, ge_cnt / a, 0.0)
            total += sign * np.where(ok, part, 0.0).sum(axis=0)
        return total


def _fill_queries(q: np.ndarray, keys_sorted: np.ndarray, order: np.ndarray, kk: np.ndarray, oo: np.ndarray) -> None:
    """For every pair (level k, node o) in a sorted group table: group start, own position, group end.

    The query for (k, d) is answered at the pair's own position, since the pair (d, k) itself is in the
    group it queries, with exactly the query value.
    """
    m = keys_sorted.shape[0]
    if m == 0:
        return
    pos = np.arange(m)
    new_run = np.r_[True, keys_sorted[1:] != keys_sorted[:-1]]
    start = np.maximum.accumulate(np.where(new_run, pos, 0))
    end_run = np.r_[keys_sorted[1:] != keys_sorted[:-1], True]
    end = np.minimum.accumulate(np.where(end_run, pos + 1, m)[::-1])[::-1]
    k, o = kk[order], oo[order]
    q[0, k, o] = start
    q[1, k, o] = pos
    q[2, k, o] = end
