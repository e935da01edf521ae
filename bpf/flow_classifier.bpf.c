/* SPDX-License-Identifier: Apache-2.0 */
/*
 * flow_classifier.bpf.c -- TC egress classifier of design §4 "Enforcement" (our default mode: BPF + HTB).
 *
 * Attached on the provider's egress device. For every outgoing packet it:
 *   1. looks the packet's destination (address, port) up in rn_flows, which the node agent fills with the
 *      admitted migration flows;
 *   2. for a known flow: rewrites the DSCP code point by class (EF/AF41/CS1/BE), sets skb->priority to the
 *      flow's HTB class so the HTB qdisc queues it there (HTB reads skb->priority before any filter), and
 *      counts wire bytes and packets;
 *   3. for anything else (research traffic): counts it under the all-zero key and leaves it alone, so HTB puts
 *      it in its default class, which keeps the reserve B_res.
 * The rate itself is enforced by HTB, not here: STACK.md measured that queueing (HTB) shapes TCP exactly, while
 * dropping in BPF (token_bucket.bpf.c) makes TCP collapse. Verdict is always TC_ACT_OK: this program never drops.
 *
 * Compile-time settings (-D from the Python loader): RN_MAX_FLOWS (map size), RN_SET_PRIORITY (1 = steer into
 * HTB classes; 0 = only mark and count).
 */
#include "rn_parse.h"

#ifndef RN_SET_PRIORITY
#define RN_SET_PRIORITY 1
#endif

/* flow -> class + HTB classid; written by the agent, read here. */
BPF_HASH(rn_flows, struct rn_flow_key, struct rn_flow_info, RN_MAX_FLOWS);
/* flow -> counters; one copy per CPU so increments need no atomic instructions. Key 0 = unclassified. */
BPF_PERCPU_HASH(rn_flow_stats, struct rn_flow_key, struct rn_flow_stats, RN_MAX_FLOWS + 1);

int rn_classify(struct __sk_buff *skb)
{
	struct rn_pkt p = {};
	struct rn_flow_stats zero = {};
	struct rn_flow_key other = {};
	struct rn_flow_info *info;
	struct rn_flow_stats *st;
	__u32 segs;
	__u64 wire;

	if (rn_parse(skb, &p) <= 0)
		return TC_ACT_OK;
	wire = rn_wire_bytes(skb, &p, &segs);

	info = rn_flows.lookup(&p.key);
	if (!info) {
		st = rn_flow_stats.lookup_or_try_init(&other, &zero);
		if (st) {
			st->bytes += wire;
			st->packets += segs;
		}
		return TC_ACT_OK;
	}

	st = rn_flow_stats.lookup_or_try_init(&p.key, &zero);
	if (st) {
		st->bytes += wire;
		st->packets += segs;
	}
#if RN_SET_PRIORITY
	skb->priority = info->classid;
#endif
	/* Last: writing the packet invalidates packet pointers. A failed rewrite still sends the packet. */
	rn_set_dscp(skb, &p, rn_class_dscp(info->flow_class));
	return TC_ACT_OK;
}
