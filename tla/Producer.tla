------------------------------ MODULE Producer ------------------------------
(***************************************************************************)
(* Idempotent producers against one partition's leader.                    *)
(*                                                                         *)
(* Producer side (the client's half, DESIGN.md section 3): each producer   *)
(* has a producer id (its name in Producers) and a producer epoch, and     *)
(* numbers its batches per partition with sequences when it first sends    *)
(* them. A batch is one record here, identified by a record id <<p, n>>;   *)
(* n is the order in which the application handed it to the producer.     *)
(* Requests are retried as they are (each retry is a new attempt, a      *)
(* request of its own), time out (outcome unknown: the request may still  *)
(* be in the network and be appended later), and a                        *)
(* batch whose outcome is unknown may be failed to the caller ("outcome    *)
(* unknown": it may be in the log). A new producer epoch is taken only     *)
(* when no batch of the partition is in flight or unresolved, and only     *)
(* never-sent batches are numbered under it. With RenumberRefused (the    *)
(* SDK's rule), a sent batch counts as never sent, and may be numbered     *)
(* under the new epoch, once every attempt of it was answered with a       *)
(* refusal given before any append (OUT_OF_ORDER_SEQUENCE, fenced): an     *)
(* attempt timed out might still be appended.                              *)
(*                                                                         *)
(* Network: requests and replies are lost and reordered. MaxDups bounds    *)
(* deliveries that keep a request for another delivery (duplication); with *)
(* MaxDups = 0 each attempt reaches the leader at most once, as over TCP   *)
(* (a retry is a new request, on a new connection after a loss). A reply   *)
(* is taken only for the attempt in flight: an attempt that timed out has  *)
(* lost its connection, and its reply goes nowhere.                        *)
(*                                                                         *)
(* Leader side (dataplane/replica/producer_state.py): the producer state   *)
(* is a function of the log (every replica feeds its table from the       *)
(* batches its log gains, and rebuilds it after a truncation). A batch of  *)
(* an older producer epoch is fenced; a newer epoch or an unknown producer *)
(* must start at sequence 0; a sequence equal to one of the last W of the  *)
(* producer's current epoch is a duplicate answered with its original      *)
(* offset; one older than all of those is DUPLICATE_SEQUENCE; otherwise it *)
(* must follow the last sequence exactly, else OUT_OF_ORDER_SEQUENCE.      *)
(*                                                                         *)
(* Replication is abstracted to what DataPlane.tla proves of it: a         *)
(* committed prefix (the HW) that every later leader holds. A leader       *)
(* change keeps any prefix of the leader's log that covers the HW (the     *)
(* uncommitted tail may be lost in part or whole) and drops the old        *)
(* leader's waiting replies. Replies are acks=all: sent once the HW passes *)
(* the batch.                                                              *)
(*                                                                         *)
(* Bug switches on one known mistake; each broken model must fail.         *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC

CONSTANTS
    Producers,        \* producer ids (model values)
    NumRecords,       \* records per producer, handed to it in order 1..NumRecords
    MaxInFlight,      \* unresolved batches per producer and partition (Kafka: 5)
    Window,           \* batches the leader keeps per producer (Kafka: 5)
    MaxProducerEpoch, \* bound on producer epochs (0..MaxProducerEpoch)
    MaxLeaderChanges, \* bound on leader changes
    MaxDups,          \* bound on deliveries that keep their request (duplication)
    RenumberRefused,  \* a sent batch whose every attempt was refused may take new numbers
    Bug               \* "none" or one of BugNames

BugNames == {"none", "restamp_unknown", "restamp_rejected", "dup_without_offset",
             "no_gap_check", "no_rebuild", "dupseq_as_written"}

ASSUME /\ NumRecords \in Nat \ {0}
       /\ MaxInFlight \in Nat \ {0}
       /\ Window \in Nat \ {0}
       /\ MaxProducerEpoch \in Nat
       /\ MaxLeaderChanges \in Nat
       /\ MaxDups \in Nat
       /\ RenumberRefused \in BOOLEAN
       /\ Bug \in BugNames

Records == Producers \X (1..NumRecords)

\* A batch's state at its producer:
\*   "queued"   never sent, no numbers yet
\*   "inflight" a request is outstanding
\*   "unknown"  sent, no request outstanding: timed out (outcome unknown)
\*              or answered with a retriable error; it keeps its numbers
\*   "acked"    acknowledged with an offset
\*   "written"  reported written without an offset (Bug = "dupseq_as_written")
\*   "rejected" every attempt refused before any append (RenumberRefused), or
\*              the last one refused (Bug = "restamp_rejected"): it may take new
\*              numbers under a new epoch
\*   "failed"   given up: failed to the caller (it may be in the log)
\*   "notwritten" given up while "rejected" with every attempt refused: failed
\*              to the caller as not written
States == {"queued", "inflight", "unknown", "rejected", "acked", "written", "failed", "notwritten"}

VARIABLES
    bstate,     \* bstate[r]: the state of record r's batch at its producer
    bnum,       \* bnum[r]: <<producer epoch, sequence>> of r's batch (<<0, 0>> while queued)
    boff,       \* boff[r]: the offset r was acknowledged with (0: none)
    brefused,   \* brefused[r]: every attempt of r under its numbers was answered with a refusal
    pepoch,     \* pepoch[p]: p's current producer epoch
    nextSeq,    \* nextSeq[p]: the next sequence p hands out under pepoch[p]
    req,        \* requests in the network: [rec, pe, seq, cur] (a set: reordering)
    resp,       \* replies in the network: [rec, pe, seq, cur, kind, off]
    dups,       \* deliveries that kept their request for another delivery
    log,        \* the leader's log: sequence of [rec, pe, seq]; offsets start at 1
    tlog,       \* the log the leader's producer table was built from (= log unless Bug = "no_rebuild")
    hw,         \* high watermark: log[1..hw] is committed
    pending,    \* replies waiting for the HW: [rec, pe, seq, cur, off]
    lchanges    \* leader changes so far

producerVars == <<bstate, bnum, boff, brefused, pepoch, nextSeq>>
netVars == <<req, resp, dups>>
leaderVars == <<log, tlog, hw, pending, lchanges>>
vars == <<producerVars, netVars, leaderVars>>

MaxLen == Cardinality(Records) * (1 + MaxLeaderChanges + MaxProducerEpoch)
Max(S) == CHOOSE x \in S : \A y \in S : y <= x
Min(S) == CHOOSE x \in S : \A y \in S : x <= y
Kinds == {"ok", "oos", "fenced", "dupseq"}

Unresolved(p) == {r \in Records : r[1] = p /\ bstate[r] \in {"inflight", "unknown", "rejected"}}
\* Offsets in l holding record r.
At(l, r) == {i \in 1..Len(l) : l[i].rec = r}

---------------------------------------------------------------------------
TypeOK ==
    /\ bstate \in [Records -> States]
    /\ bnum \in [Records -> (0..MaxProducerEpoch) \X (0..NumRecords)]
    /\ boff \in [Records -> 0..MaxLen]
    /\ brefused \in [Records -> BOOLEAN]
    /\ pepoch \in [Producers -> 0..MaxProducerEpoch]
    /\ nextSeq \in [Producers -> 0..NumRecords]
    /\ \A m \in req : m.rec \in Records
    /\ \A m \in resp : m.rec \in Records /\ m.kind \in Kinds
    /\ dups \in 0..MaxDups
    /\ Len(log) <= MaxLen
    /\ hw \in 0..Len(log)
    /\ lchanges \in 0..MaxLeaderChanges

Init ==
    /\ bstate = [r \in Records |-> "queued"]
    /\ bnum = [r \in Records |-> <<0, 0>>]
    /\ boff = [r \in Records |-> 0]
    /\ brefused = [r \in Records |-> TRUE]
    /\ pepoch = [p \in Producers |-> 0]
    /\ nextSeq = [p \in Producers |-> 0]
    /\ req = {}
    /\ resp = {}
    /\ dups = 0
    /\ log = <<>>
    /\ tlog = <<>>
    /\ hw = 0
    /\ pending = {}
    /\ lchanges = 0

---------------------------------------------------------------------------
(* The producer.                                                           *)

\* Once r's outcome is settled at its producer, its numbers and the replies
\* still in the network for it no longer matter (its requests do).
Resolved(r) ==
    /\ bnum' = [bnum EXCEPT ![r] = <<0, 0>>]
    /\ resp' = {x \in resp : x.rec # r}

\* r's attempt in flight ended without its reply being taken (a timeout, or
\* a reply taken): every request of r still in the network is a stale
\* attempt, whose reply would go nowhere; replies for r are dropped. Stale
\* attempts with the same numbers are one message (a set).
StaleReqs(r) == {IF x.rec = r THEN [x EXCEPT !.cur = FALSE] ELSE x : x \in req}
Stale(r) ==
    /\ req' = StaleReqs(r)
    /\ resp' = {x \in resp : x.rec # r}
    /\ pending' = {x \in pending : x.rec # r}

\* p sends its next queued batch, numbering it under its current epoch.
\* Batches leave the queue in order; at most MaxInFlight are unresolved.
Send(p) ==
    LET queued == {r \in Records : r[1] = p /\ bstate[r] = "queued"}
        r == CHOOSE x \in queued : \A y \in queued : x[2] <= y[2]
    IN /\ queued # {}
       /\ Cardinality(Unresolved(p)) < MaxInFlight
       /\ nextSeq[p] < NumRecords
       /\ bstate' = [bstate EXCEPT ![r] = "inflight"]
       /\ bnum' = [bnum EXCEPT ![r] = <<pepoch[p], nextSeq[p]>>]
       /\ brefused' = [brefused EXCEPT ![r] = TRUE]
       /\ nextSeq' = [nextSeq EXCEPT ![p] = nextSeq[p] + 1]
       /\ req' = req \cup {[rec |-> r, pe |-> pepoch[p], seq |-> nextSeq[p], cur |-> TRUE]}
       /\ UNCHANGED <<boff, pepoch, resp, dups, leaderVars>>

\* The request times out: the outcome is unknown (the request may still be
\* in the network, or appended with its reply lost or not yet sent). Not
\* every attempt of r is refused now.
Timeout(r) ==
    /\ bstate[r] = "inflight"
    /\ bstate' = [bstate EXCEPT ![r] = "unknown"]
    /\ brefused' = [brefused EXCEPT ![r] = FALSE]
    /\ Stale(r)
    /\ UNCHANGED <<bnum, boff, pepoch, nextSeq, dups, log, tlog, hw, lchanges>>

\* A retry keeps the batch's numbers; it is a new attempt.
Retry(r) ==
    /\ bstate[r] \in {"unknown", "rejected"}
    /\ bstate' = [bstate EXCEPT ![r] = "inflight"]
    /\ req' = req \cup {[rec |-> r, pe |-> bnum[r][1], seq |-> bnum[r][2], cur |-> TRUE]}
    /\ UNCHANGED <<bnum, boff, brefused, pepoch, nextSeq, resp, dups, leaderVars>>

\* Delivery timeout: the batch is failed to the caller as "outcome unknown",
\* or as "not written" if every attempt of it was refused.
GiveUp(r) ==
    /\ bstate[r] \in {"unknown", "rejected"}
    /\ bstate' = [bstate EXCEPT ![r] =
                     IF bstate[r] = "rejected" /\ brefused[r] THEN "notwritten" ELSE "failed"]
    /\ Resolved(r)
    /\ UNCHANGED <<boff, brefused, pepoch, nextSeq, req, dups, leaderVars>>

\* A new producer epoch; sequences restart at 0. Correct: only when no
\* batch is unresolved, so only never-sent batches get numbers under it.
\* BROKEN (restamp_unknown): after a delivery timeout the producer bumps
\* while batches of unknown outcome remain and re-stamps them: they return
\* to the queue and are sent again under the new epoch from sequence 0,
\* although one may already be in the log with its reply lost.
\* With RenumberRefused, a "rejected" batch (every attempt refused) is
\* numbered again under the new epoch (the SDK's rule).
\* BROKEN (restamp_rejected): a batch is "rejected" once its last attempt is
\* refused, though an earlier attempt timed out and may still be appended.
Restampable == CASE Bug = "restamp_unknown" -> {"unknown"}
                 [] Bug = "restamp_rejected" \/ RenumberRefused -> {"rejected"}
                 [] OTHER -> {}

BumpEpoch(p) ==
    /\ pepoch[p] < MaxProducerEpoch
    /\ \A r \in Unresolved(p) : bstate[r] \in Restampable
    /\ bstate' = [r \in Records |-> IF r \in Unresolved(p) THEN "queued" ELSE bstate[r]]
    /\ bnum' = [r \in Records |-> IF r \in Unresolved(p) THEN <<0, 0>> ELSE bnum[r]]
    /\ pepoch' = [pepoch EXCEPT ![p] = pepoch[p] + 1]
    /\ nextSeq' = [nextSeq EXCEPT ![p] = 0]
    /\ UNCHANGED <<boff, brefused, netVars, leaderVars>>

\* A reply applies to the batch only while its request is outstanding and
\* only if it answers the attempt in flight; other replies are dropped (a
\* timed-out request's connection is gone).
Receive(m) ==
    /\ m \in resp
    /\ LET r == m.rec IN
       IF bstate[r] = "inflight" /\ bnum[r] = <<m.pe, m.seq>> /\ m.cur
         THEN CASE m.kind = "ok" ->
                     /\ bstate' = [bstate EXCEPT ![r] = "acked"]
                     /\ boff' = [boff EXCEPT ![r] = m.off]
                     /\ Resolved(r)
                     /\ UNCHANGED <<req, pending>>
                [] m.kind = "dupseq" ->
                     \* older than the leader's window: the caller gets "outcome
                     \* unknown". BROKEN (dupseq_as_written): taken as written.
                     /\ bstate' = [bstate EXCEPT ![r] =
                                      IF Bug = "dupseq_as_written" THEN "written" ELSE "failed"]
                     /\ UNCHANGED <<boff, req, pending>>
                     /\ Resolved(r)
                [] OTHER ->
                     \* OUT_OF_ORDER_SEQUENCE (or UNKNOWN_PRODUCER_ID), fenced:
                     \* refused before any append; retriable, numbers kept, or
                     \* "rejected" (new numbers at the next epoch) when every
                     \* attempt was refused. BROKEN (restamp_rejected): when
                     \* this one was, whatever became of the earlier ones.
                     /\ bstate' = [bstate EXCEPT ![r] =
                          IF \/ RenumberRefused /\ brefused[r]
                             \/ Bug = "restamp_rejected" /\ m.kind = "oos"
                          THEN "rejected" ELSE "unknown"]
                     /\ Stale(r)
                     /\ UNCHANGED <<bnum, boff>>
         ELSE /\ resp' = resp \ {m}
              /\ UNCHANGED <<bstate, bnum, boff, req, pending>>
    /\ UNCHANGED <<brefused, pepoch, nextSeq, dups, log, tlog, hw, lchanges>>

---------------------------------------------------------------------------
(* The leader.                                                             *)

\* The leader's verdict on request m from its producer table, built from
\* the log l: [kind |-> "append" | "dup" | "oos" | "fenced" | "dupseq", off].
Check(m, l) ==
    LET p == m.rec[1]
        S == {i \in 1..Len(l) : l[i].rec[1] = p}
    IN IF S = {}
       THEN \* unknown producer: its first batch must have sequence 0
            IF m.seq = 0 THEN [kind |-> "append", off |-> 0]
                         ELSE [kind |-> "oos", off |-> 0]
       ELSE
       LET last == Max(S)
           e == l[last].pe
           \* the last Window batches of p (all of the current epoch: the
           \* table starts afresh on a new epoch, and epochs never go back)
           win == {i \in S : l[i].pe = e /\ Cardinality({j \in S : j > i}) < Window}
           dup == {i \in win : l[i].seq = m.seq}
       IN CASE m.pe < e -> [kind |-> "fenced", off |-> 0]
            [] m.pe > e -> IF m.seq = 0 THEN [kind |-> "append", off |-> 0]
                                        ELSE [kind |-> "oos", off |-> 0]
            [] dup # {} -> [kind |-> "dup", off |-> Max(dup)]
            [] m.seq = l[last].seq + 1 -> [kind |-> "append", off |-> 0]
            [] m.seq < Min({l[i].seq : i \in win}) -> [kind |-> "dupseq", off |-> 0]
            \* BROKEN (no_gap_check): a sequence gap is accepted
            [] Bug = "no_gap_check" -> [kind |-> "append", off |-> 0]
            [] OTHER -> [kind |-> "oos", off |-> 0]

\* The leader handles a request: appends it, answers a duplicate (once the
\* HW passes the original), or answers an error at once. A delivery may keep
\* the request in the network for another one (duplication, bounded).
Handle(m) ==
    /\ m \in req
    /\ \/ req' = req \ {m} /\ UNCHANGED dups
       \/ dups < MaxDups /\ dups' = dups + 1 /\ UNCHANGED req
    /\ LET c == Check(m, tlog)
           e == [rec |-> m.rec, pe |-> m.pe, seq |-> m.seq]
       IN CASE c.kind = "append" ->
                 /\ Len(log) < MaxLen
                 /\ log' = Append(log, e)
                 /\ tlog' = Append(tlog, e)
                 /\ pending' = pending \cup {[rec |-> m.rec, pe |-> m.pe, seq |-> m.seq,
                                              cur |-> m.cur, off |-> Len(log) + 1]}
                 /\ UNCHANGED resp
            [] c.kind = "dup" ->
                 \* BROKEN (dup_without_offset): a duplicate is answered at once
                 \* without its offset (the SDK resolved it with offset -1)
                 /\ IF Bug = "dup_without_offset"
                      THEN /\ resp' = resp \cup {[rec |-> m.rec, pe |-> m.pe, seq |-> m.seq,
                                                   cur |-> m.cur, kind |-> "ok", off |-> 0]}
                           /\ UNCHANGED pending
                      ELSE /\ pending' = pending \cup {[rec |-> m.rec, pe |-> m.pe, seq |-> m.seq,
                                                        cur |-> m.cur, off |-> c.off]}
                           /\ UNCHANGED resp
                 /\ UNCHANGED <<log, tlog>>
            [] OTHER ->
                 /\ resp' = resp \cup {[rec |-> m.rec, pe |-> m.pe, seq |-> m.seq,
                                        cur |-> m.cur, kind |-> c.kind, off |-> 0]}
                 /\ UNCHANGED <<log, tlog, pending>>
    /\ UNCHANGED <<producerVars, hw, lchanges>>

\* Replication, abstracted: the HW passes one more entry.
Commit ==
    /\ hw < Len(log)
    /\ hw' = hw + 1
    /\ UNCHANGED <<producerVars, netVars, log, tlog, pending, lchanges>>

\* acks=all: the reply goes out once the HW passes the batch.
Reply(d) ==
    /\ d \in pending
    /\ d.off <= hw
    /\ pending' = pending \ {d}
    /\ resp' = resp \cup {[rec |-> d.rec, pe |-> d.pe, seq |-> d.seq, cur |-> d.cur,
                          kind |-> "ok", off |-> d.off]}
    /\ UNCHANGED <<producerVars, req, dups, log, tlog, hw, lchanges>>

\* A new leader: its log holds the committed prefix and any part of the old
\* leader's uncommitted tail; it rebuilds its producer table from that log;
\* the old leader's waiting replies are never sent (NOT_LEADER or a timeout).
\* BROKEN (no_rebuild): the new leader's table is not rebuilt after the
\* truncation: it still knows batches its log no longer holds.
LeaderChange ==
    /\ lchanges < MaxLeaderChanges
    /\ \E k \in hw..Len(log) :
         /\ log' = SubSeq(log, 1, k)
         /\ tlog' = IF Bug = "no_rebuild" THEN tlog ELSE SubSeq(log, 1, k)
    /\ pending' = {}
    /\ lchanges' = lchanges + 1
    /\ UNCHANGED <<producerVars, netVars, hw>>

\* The network loses a request or a reply.
LoseReq(m) ==
    /\ m \in req
    /\ req' = req \ {m}
    /\ UNCHANGED <<producerVars, resp, dups, leaderVars>>

LoseResp(m) ==
    /\ m \in resp
    /\ resp' = resp \ {m}
    /\ UNCHANGED <<producerVars, req, dups, leaderVars>>

Next ==
    \/ \E p \in Producers : Send(p) \/ BumpEpoch(p)
    \/ \E r \in Records : Timeout(r) \/ Retry(r) \/ GiveUp(r)
    \/ \E m \in resp : Receive(m) \/ LoseResp(m)
    \/ \E m \in req : Handle(m) \/ LoseReq(m)
    \/ Commit
    \/ \E d \in pending : Reply(d)
    \/ LeaderChange

Spec == Init /\ [][Next]_vars

\* Producers are interchangeable (a record id names its producer).
Symmetry == Permutations(Producers)

---------------------------------------------------------------------------
(* Invariants.                                                             *)

\* No record is appended twice: a record id is at most once in the
\* leader's log. The committed log is a prefix of it, and every replica's
\* log a prefix of some leader's, so none holds a record twice either.
NoDuplicate == \A r \in Records : Cardinality(At(log, r)) <= 1

\* Every acknowledged record is committed, at the offset it was
\* acknowledged with.
AckedAtOffset ==
    \A r \in Records : bstate[r] = "acked" =>
        /\ 1 <= boff[r] /\ boff[r] <= hw
        /\ log[boff[r]].rec = r

\* A record reported written without an offset is committed.
WrittenCommitted ==
    \A r \in Records : bstate[r] = "written" => \E i \in 1..hw : log[i].rec = r

\* A record failed to its caller as not written is not in the log (and,
\* checked in every state, never gets there later).
NotWrittenAbsent ==
    \A r \in Records : bstate[r] = "notwritten" => At(log, r) = {}

\* Per producer, log order is send order (the order records were handed to it).
SendOrder ==
    \A i, j \in 1..Len(log) :
        (i < j /\ log[i].rec[1] = log[j].rec[1]) => log[i].rec[2] < log[j].rec[2]

\* The committed log only grows.
CommittedStable == [][hw' >= hw /\ SubSeq(log', 1, hw) = SubSeq(log, 1, hw)]_vars

=============================================================================
