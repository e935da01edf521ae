/* SPDX-License-Identifier: Apache-2.0 */
/*
 * killswitch.bpf.c -- the provider's kill-switch, design §4 "Enforcement" / §1 ("the node must stop taking new
 * work within a millisecond"). TC ingress program on the provider's device.
 *
 * The switch is one 32-bit slot of an array map. Flipping it is a single bpf() map write from the agent; the
 * very next packet sees the new value, which is why this acts in well under a millisecond whereas an
 * iptables rule needs a whole rule-set transaction (STACK.md: ~0.1 ms vs ~10 ms).
 *   RN_KS_OFF    everything passes;
 *   RN_KS_NO_NEW a TCP SYN without ACK (someone opening a connection to this node) is dropped; established
 *                connections, and the answers to connections this node opens itself (SYN+ACK), pass;
 *   RN_KS_STRICT additionally drops everything that is not an established TCP migration transfer. "Established"
 *                is asked of the kernel's own socket table (bpf_sk_lookup_tcp finds the socket the packet is
 *                for); "migration" means one of its two ports is in the allow-list rn_ks_ports, which the agent
 *                fills with the migration ports. ARP and IPv6 neighbour discovery pass, or the transfers would
 *                lose their next hop.
 * Whatever the mode, the program counts received bytes per DSCP code point (rn_rx_dscp), so a receiver can
 * check the marking done by the sender's flow_classifier.bpf.c.
 */
#include "rn_parse.h"

#define RN_IPPROTO_ICMPV6 58

BPF_ARRAY(rn_ks_mode, __u32, 1);
BPF_ARRAY(rn_ks_stats, struct rn_ks_stats, 1);
BPF_HASH(rn_ks_ports, __u16, __u8, RN_MAX_PORTS);
BPF_PERCPU_ARRAY(rn_rx_dscp, struct rn_flow_stats, 64);

/* Is this TCP packet part of a connection in a data-carrying state in this network namespace? */
static __always_inline int rn_established(struct __sk_buff *skb, struct rn_pkt *p)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 state;

	if (p->family == RN_L3_IPV4) {
		__builtin_memcpy(&t.ipv4.saddr, &p->saddr[12], 4);
		__builtin_memcpy(&t.ipv4.daddr, &p->key.daddr[12], 4);
		t.ipv4.sport = RN_HTONS(p->sport);
		t.ipv4.dport = RN_HTONS(p->dport);
		sk = bpf_sk_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	} else {
		__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->key.daddr, 16);
		t.ipv6.sport = RN_HTONS(p->sport);
		t.ipv6.dport = RN_HTONS(p->dport);
		sk = bpf_sk_lookup_tcp(skb, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return 0;
	state = sk->state;
	/* The verifier insists that every socket reference taken is released. */
	bpf_sk_release(sk);
	return state == BPF_TCP_ESTABLISHED || state == BPF_TCP_FIN_WAIT1 || state == BPF_TCP_FIN_WAIT2 ||
	       state == BPF_TCP_CLOSE_WAIT || state == BPF_TCP_LAST_ACK || state == BPF_TCP_CLOSING;
}

static __always_inline int rn_drop(int syn)
{
	__u32 zero = 0;
	struct rn_ks_stats *s = rn_ks_stats.lookup(&zero);

	if (s) {
		if (syn)
			__sync_fetch_and_add(&s->syn_dropped, 1);
		else
			__sync_fetch_and_add(&s->other_dropped, 1);
		/* Racy on purpose: two CPUs may both write; both timestamps are "the first drop" within ns. */
		if (s->first_drop_ns == 0)
			s->first_drop_ns = bpf_ktime_get_ns();
	}
	return TC_ACT_SHOT;
}

int rn_killswitch(struct __sk_buff *skb)
{
	struct rn_pkt p = {};
	__u32 zero = 0;
	__u32 *mode;
	int parsed = rn_parse(skb, &p);

	if (parsed > 0) {
		__u32 dscp = p.ds_field >> 2;
		struct rn_flow_stats *d = rn_rx_dscp.lookup(&dscp);
		__u32 segs;

		if (d) {
			d->bytes += rn_wire_bytes(skb, &p, &segs);
			d->packets += segs;
		}
	}

	mode = rn_ks_mode.lookup(&zero);
	if (!mode || *mode == RN_KS_OFF)
		return TC_ACT_OK;
	if (parsed <= 0)
		return parsed == 0 ? TC_ACT_OK : rn_drop(0); /* non-IP (ARP) passes; truncated IP does not */

	if (p.proto == IPPROTO_TCP && (p.tcp_flags & (RN_TCP_SYN | RN_TCP_ACK)) == RN_TCP_SYN)
		return rn_drop(1);
	if (*mode == RN_KS_NO_NEW)
		return TC_ACT_OK;

	/* RN_KS_STRICT */
	if (p.family == RN_L3_IPV6 && p.proto == RN_IPPROTO_ICMPV6)
		return TC_ACT_OK;
	if (p.proto == IPPROTO_TCP && (rn_ks_ports.lookup(&p.sport) || rn_ks_ports.lookup(&p.dport)) &&
	    rn_established(skb, &p)) {
		struct rn_ks_stats *s = rn_ks_stats.lookup(&zero);

		if (s)
			__sync_fetch_and_add(&s->passed_established, 1);
		return TC_ACT_OK;
	}
	return rn_drop(0);
}
