/* SPDX-License-Identifier: Apache-2.0 */
/*
 * syn_probe.bpf.c -- measurement aid for scripts/bench_net.py (kill-switch latency, design §4: "median 0.6 ms,
 * p99 0.9 ms" in the paper). Not part of enforcement.
 *
 * Attached on the probed host before anything that may drop: the ingress program records when each SYN to
 * RN_PROBE_PORT arrived (by client source port); the egress program records which SYNs the TCP stack answered
 * (SYN+ACK from a listener, or RST when nothing listens -- the benchmark uses the latter, so no accept queue
 * can fill up and drop SYNs of its own). A SYN with no answer was dropped by whatever sits after the probe --
 * the BPF kill-switch or an iptables/nftables rule -- so both are measured by the same yardstick.
 * Returns TC_ACT_UNSPEC: "no opinion, next filter".
 */
#include "rn_parse.h"

BPF_HASH(rn_probe_syn_ns, __u16, __u64, 65536);
BPF_HASH(rn_probe_answer_ns, __u16, __u64, 65536);

#define RN_TCP_RST 0x04

int rn_probe_ingress(struct __sk_buff *skb)
{
	struct rn_pkt p = {};
	__u64 now;

	if (rn_parse(skb, &p) > 0 && p.proto == IPPROTO_TCP && p.dport == RN_PROBE_PORT &&
	    (p.tcp_flags & (RN_TCP_SYN | RN_TCP_ACK)) == RN_TCP_SYN) {
		now = bpf_ktime_get_ns();
		rn_probe_syn_ns.update(&p.sport, &now);
	}
	return TC_ACT_UNSPEC;
}

int rn_probe_egress(struct __sk_buff *skb)
{
	struct rn_pkt p = {};
	__u64 now;

	if (rn_parse(skb, &p) > 0 && p.proto == IPPROTO_TCP && p.sport == RN_PROBE_PORT &&
	    ((p.tcp_flags & (RN_TCP_SYN | RN_TCP_ACK)) == (RN_TCP_SYN | RN_TCP_ACK) || (p.tcp_flags & RN_TCP_RST))) {
		now = bpf_ktime_get_ns();
		rn_probe_answer_ns.update(&p.dport, &now);
	}
	return TC_ACT_UNSPEC;
}
