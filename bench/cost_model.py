#!/usr/bin/env python3
"""Cost model of all-reduce on a team across NVLink domains (BENCHMARKS.md, "Teams across NVLink
domains: the cost model"). Standard library only; prints the tables of that section.

    python3 bench/cost_model.py                 # the tables as BENCHMARKS.md shows them
    python3 bench/cost_model.py --alpha-rail-us 50 --size 256M

N domains of L GPUs (P = N L ranks), message S bytes (nccl-tests' size), busbw = S * 2(P-1)/P / t.
Bandwidths are per GPU and direction:
  B_in  : in-domain bus bandwidth of one reduce-scatter or all-gather (NVLS, --nvls-busbw)
  B_nic : one NIC per GPU (its rail), --nic-gbps Gbit/s times --nic-eff
Bandwidth terms of the whole message (seconds):
  a = S (L-1)/L / B_in               in-domain reduce-scatter (and the same again for all-gather)
  r = 2(N-1)/N (S/L) / B_nic         ring all-reduce of the 1/L shard on each rail (L rails at once)
  flat ring : t = S 2(P-1)/P / (L B_nic)     every ring crosses each domain boundary on one NIC,
                                             L rings in parallel: the NICs bound it
  NVLS_TREE : t = max(2a, q),  q = 2 (S/L) / B_nic for N >= 3 (double binary tree on each rail:
              every GPU sends, and receives, twice its shard), (S/L) / B_nic for N = 2
  hierarchy, not pipelined : t = 2a + r
  hierarchy, pipelined bound (K -> infinity, no latency) : t = max(2a, r)
Pipelined in K chunks with per-chunk latencies (alpha_in per in-domain step, alpha_rail per rail
all-reduce call), the two in-domain stages sharing NVLink and the SMs, the rail stage the NICs:
  c_nv   = 2 alpha_in + 2a/K             (reduce-scatter of chunk k+1, all-gather of chunk k-1)
  c_rail = alpha_rail + r/K
  T(K)   = (2 alpha_in + 2a/K) + (alpha_rail + r/K) + (K-1) max(c_nv, c_rail)
(the first chunk goes through all three stages, then one chunk leaves per period).
"""

import argparse
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    text = text.strip().upper()
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(text[: len(text) - len(unit)]) * UNITS[unit]


def show_size(n):
    for unit in ("G", "M", "K"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return str(n)


def chunk(size, k):
    """The chunk of a message of `size` bytes in `k` chunks, for the tables."""
    return show_size(size // k) if size % k == 0 else f"{size / k / 2**20:.1f}M"


class Model:
    def __init__(self, args):
        self.L = args.gpus_per_domain
        self.b_in = args.nvls_busbw * 1e9
        self.b_nic = args.nic_gbps / 8 * args.nic_eff * 1e9
        self.alpha_in = args.alpha_in_us * 1e-6
        self.alpha_rail = args.alpha_rail_us * 1e-6

    def factor(self, n):
        p = n * self.L
        return 2 * (p - 1) / p

    def terms(self, n, size):
        a = size * (self.L - 1) / self.L / self.b_in
        r = 2 * (n - 1) / n * (size / self.L) / self.b_nic
        return a, r

    def busbw(self, n, size, t):
        return size * self.factor(n) / t / 1e9

    def flat_ring(self, n, size):
        return self.busbw(n, size, size * self.factor(n) / (self.L * self.b_nic))

    def nvls_tree(self, n, size):
        a, _ = self.terms(n, size)
        shard = size / self.L
        q = (shard if n == 2 else 2 * shard) / self.b_nic
        return self.busbw(n, size, max(2 * a, q))

    def unpipelined(self, n, size):
        a, r = self.terms(n, size)
        return self.busbw(n, size, 2 * a + r)

    def bound(self, n, size):
        a, r = self.terms(n, size)
        return self.busbw(n, size, max(2 * a, r))

    def pipelined(self, n, size, k):
        a, r = self.terms(n, size)
        c_nv = 2 * self.alpha_in + 2 * a / k
        c_rail = self.alpha_rail + r / k
        t = c_nv + c_rail + (k - 1) * max(c_nv, c_rail)
        return self.busbw(n, size, t)

    def best(self, n, size, kmax=4096):
        """(K, busbw) of the fastest pipeline depth."""
        return max(((k, self.pipelined(n, size, k)) for k in range(1, kmax + 1)), key=lambda kb: kb[1])

    def within(self, n, size, share=0.9, kmax=4096):
        """The smallest K whose busbw is at least `share` of the bound at `size`, or None."""
        target = share * self.bound(n, size)
        for k in range(1, kmax + 1):
            if self.pipelined(n, size, k) >= target:
                return k
        return None


def tables(m, domains, size, share):
    out = []
    out.append(
        f"All-reduce busbw (GB/s), {m.L} GPUs per domain, in-domain {m.b_in / 1e9:.0f} GB/s, "
        f"NIC {m.b_nic / 1e9:.1f} GB/s per GPU; pipelined at {show_size(size)} with alpha_in "
        f"{m.alpha_in * 1e6:g} us, alpha_rail {m.alpha_rail * 1e6:g} us:"
    )
    out.append("")
    out.append(
        "| domains | GPUs | flat ring | NVLS_TREE | hierarchy, not pipelined | hierarchy, pipelined bound "
        f"| pipelined at {show_size(size)}: best K, chunk, busbw (% of bound) |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|---|")
    for n in domains:
        k, bw = m.best(n, size)
        bound = m.bound(n, size)
        out.append(
            f"| {n} | {n * m.L} | {m.flat_ring(n, size):.0f} | {m.nvls_tree(n, size):.0f} "
            f"| {m.unpipelined(n, size):.0f} | {bound:.0f} "
            f"| K={k}, {chunk(size, k)}, "
            f"{bw:.0f} ({100 * bw / bound:.0f}%) |"
        )
    out.append("")
    pct = round(100 * share)
    out.append(
        f"Pipeline depth for {pct}% of the pipelined bound: the smallest message that reaches it, "
        f"and the smallest K (chunk = size / K) at a few sizes ('-': not reachable at that size, with the "
        "best share and its K):"
    )
    out.append("")
    sizes = [parse_size(s) for s in ("64M", "256M", "1G", "4G")]
    out.append(
        f"| domains | smallest message reaching {pct}% (K, chunk) | "
        + " | ".join(f"K at {show_size(s)} (chunk)" for s in sizes)
        + " |"
    )
    out.append("|---:|---|" + "---|" * len(sizes))
    for n in domains:
        smallest = "-"
        s = 1 << 20
        while s <= 64 << 30:
            k = m.within(n, s, share)
            if k is not None:
                smallest = f"{show_size(s)} (K={k}, {chunk(s, k)})"
                break
            s *= 2
        cells = []
        for s in sizes:
            k = m.within(n, s, share)
            if k is None:
                kb, bw = m.best(n, s)
                cells.append(f"- (best: {100 * bw / m.bound(n, s):.0f}% at K={kb})")
            else:
                cells.append(f"{k} ({chunk(s, k)})")
        out.append(f"| {n} | {smallest} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus-per-domain", type=int, default=8)
    p.add_argument("--nvls-busbw", type=float, default=480, help="in-domain busbw, GB/s (8xH100 NVLS: 480)")
    p.add_argument("--nic-gbps", type=float, default=400, help="one NIC per GPU, Gbit/s (400)")
    p.add_argument("--nic-eff", type=float, default=0.96, help="share of the NIC's line rate reached (0.96)")
    p.add_argument("--alpha-in-us", type=float, default=15, help="latency of one in-domain step, us (15)")
    p.add_argument("--alpha-rail-us", type=float, default=30, help="latency of one rail all-reduce, us (30)")
    p.add_argument("--domains", default="2,4,8,16,32,64")
    p.add_argument("--size", default="1G", help="message size of the pipelined column (1G)")
    p.add_argument("--share", type=float, default=0.9, help="share of the bound to reach (0.9: within 10%%)")
    args = p.parse_args(argv)
    m = Model(args)
    domains = [int(d) for d in args.domains.split(",")]
    if any(n < 2 for n in domains):
        p.error("--domains: at least 2 domains each")
    print(tables(m, domains, parse_size(args.size), args.share))


if __name__ == "__main__":
    main(sys.argv[1:])
