----------------------------- MODULE DataPlane -----------------------------
(***************************************************************************)
(* One partition of Biplane's data plane, with the controller's election  *)
(* folded in as atomic actions (Controller.tla covers the controller's    *)
(* other decisions).                                                      *)
(*                                                                         *)
(* Replicas hold logs whose entries carry the epoch they were written in. *)
(* Each replica has a written log end (Len(log[r])) and a flushed offset; *)
(* a crash keeps only the flushed prefix. Replication is one message      *)
(* family over a network that loses, duplicates and reorders:             *)
(*   "req"  follower -> leader: (epoch, log end, last epoch, flushed).    *)
(*          Pull: the fetch request. Push: the append-entries reply.      *)
(*   "data" leader -> follower: (epoch, prev offset/epoch, next entry).  *)
(*          Pull: the fetch response. Push: the append-entries request.  *)
(*   "div"  leader -> follower: where the follower's last epoch ends in   *)
(*          the leader's log; the follower truncates there.               *)
(* In both modes the leader learns a follower's position only from a     *)
(* "req", and a follower accepts entries only after the same (offset,    *)
(* epoch) check, so one family covers both; Mode = "push" adds the        *)
(* leader-initiated append (LeaderPush).                                  *)
(*                                                                         *)
(* Bug switches on one known mistake; each broken model must fail.        *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC

CONSTANTS
    Replicas,      \* replica ids (model values)
    Values,        \* client values, each written at most once (model values)
    Nil,           \* model value: "no leader" and the payload of an epoch-start entry
    Q,             \* quorum_required_acks (quorum policy)
    MinIsr,        \* min_insync_replicas (isr policy)
    Policy,        \* "quorum" | "isr"
    Mode,          \* "pull" | "push"
    Net,           \* "messages" | "atomic" (one fetch exchange per step)
    MaxEpoch,      \* bound on partition epochs
    MaxCrashes,    \* bound on crashes
    MaxMsgs,       \* bound on messages in flight (state constraint)
    MaxDups,       \* bound on duplicated deliveries
    MaxCuts,       \* bound on directed links cut at once (0: the network never partitions)
    Bug            \* "none" or one of BugNames

BugNames == {"none", "elect_by_leo", "no_fence", "report_unflushed",
             "flushed_beyond_match", "old_epoch_commit", "written_hw",
             "unfair_fetch", "elect_unfenced"}

ASSUME /\ Policy \in {"quorum", "isr"}
       /\ Mode \in {"pull", "push"}
       /\ Net \in {"messages", "atomic"}
       /\ Bug \in BugNames
       /\ Q \in 1..Cardinality(Replicas)
       /\ MinIsr \in 1..Cardinality(Replicas)
       /\ Nil \notin Replicas \cup Values
       /\ MaxCuts \in Nat

VARIABLES
    log,        \* log[r]: sequence of <<epoch, value>>; value Nil = epoch-start entry
    flushed,    \* flushed[r]: durable prefix length of log[r]
    crashes,    \* crashes so far
    epoch,      \* epoch[r]: latest partition epoch r learned (durable)
    kleader,    \* kleader[r]: leader r learned for epoch[r] (Nil: fenced, none yet)
    lead,       \* lead[r]: r acts as leader of epoch[r]
    hw,         \* hw[r]: high watermark of r while it leads (0 otherwise)
    pmatch,     \* pmatch[l][f]: leader l's last confirmed match offset of f
    pstored,    \* pstored[l][f]: what l counts as stored on f toward the HW
    msgs,       \* network: set of messages in flight (unordered: reordering)
    dups,       \* deliveries that kept their message for a second delivery
    cepoch,     \* controller: partition epoch
    cleader,    \* controller: leader of cepoch (Nil while fenced)
    cisr,       \* controller: ISR (isr policy)
    reports,    \* controller: election reports [r, le, off] for the pending election
    written,    \* values a client has written
    writeAt,    \* writeAt[v]: <<leader, epoch>> that took v (for liveness)
    acked,      \* acked[v]: epoch of the leader whose HW first passed v; 0 = not acked
    cut,        \* directed links <<a, b>> whose messages from a to b are dropped
    silent,     \* controller: link reports [r, p, e]: r has not heard from p at epoch e
    excluded    \* controller: the leader a report-triggered election refuses (Nil: none)

netVars == <<msgs, dups>>
ctrlVars == <<cepoch, cleader, cisr, reports, silent, excluded>>
clientVars == <<written, writeAt, acked>>
vars == <<log, flushed, crashes, epoch, kleader, lead, hw, pmatch, pstored,
          netVars, ctrlVars, clientVars, cut>>

N == Cardinality(Replicas)
Max(a, b) == IF a >= b THEN a ELSE b
Min(a, b) == IF a <= b THEN a ELSE b
MaxLen == Cardinality(Values) + MaxEpoch

LastEpoch(s) == IF s = <<>> THEN 0 ELSE s[Len(s)][1]
\* Offset where entries of epoch <= e end in s (epochs never decrease along a log).
EndFor(s, e) == IF \E i \in 1..Len(s) : s[i][1] <= e
                THEN CHOOSE i \in 1..Len(s) : s[i][1] <= e /\ (i = Len(s) \/ s[i+1][1] > e)
                ELSE 0
EpochAt(s, o) == IF o = 0 THEN 0 ELSE s[o][1]
Prefix(s, n) == SubSeq(s, 1, n)
Vals(s) == {s[i][2] : i \in 1..Len(s)}
IsAcked(v) == acked[v] > 0

\* A fetch answer carries the entry after offset o, if any: one entry per
\* answer keeps partial replication (bounded fetch size) in the model.
Next1(s, o) == IF o < Len(s) THEN <<s[o + 1]>> ELSE <<>>

---------------------------------------------------------------------------
TypeOK ==
    /\ log \in [Replicas -> Seq((1..MaxEpoch) \X (Values \cup {Nil}))]
    /\ \A r \in Replicas : Len(log[r]) <= MaxLen
    /\ flushed \in [Replicas -> 0..MaxLen]
    /\ \A r \in Replicas : flushed[r] <= Len(log[r])
    /\ crashes \in 0..MaxCrashes
    /\ epoch \in [Replicas -> 0..MaxEpoch]
    /\ kleader \in [Replicas -> Replicas \cup {Nil}]
    /\ lead \in [Replicas -> BOOLEAN]
    /\ hw \in [Replicas -> 0..MaxLen]
    /\ pmatch \in [Replicas -> [Replicas -> 0..MaxLen]]
    /\ pstored \in [Replicas -> [Replicas -> 0..MaxLen]]
    /\ dups \in 0..MaxDups
    /\ cepoch \in 0..MaxEpoch
    /\ cleader \in Replicas \cup {Nil}
    /\ cisr \subseteq Replicas
    /\ written \subseteq Values
    /\ acked \in [Values -> 0..MaxEpoch]
    /\ cut \subseteq Replicas \X Replicas
    /\ silent \subseteq [r : Replicas, p : Replicas, e : 0..MaxEpoch]
    /\ excluded \in Replicas \cup {Nil}

Init ==
    /\ log = [r \in Replicas |-> <<>>]
    /\ flushed = [r \in Replicas |-> 0]
    /\ crashes = 0
    /\ epoch = [r \in Replicas |-> 0]
    /\ kleader = [r \in Replicas |-> Nil]
    /\ lead = [r \in Replicas |-> FALSE]
    /\ hw = [r \in Replicas |-> 0]
    /\ pmatch = [r \in Replicas |-> [f \in Replicas |-> 0]]
    /\ pstored = [r \in Replicas |-> [f \in Replicas |-> 0]]
    /\ msgs = {}
    /\ dups = 0
    /\ cepoch = 0
    /\ cleader = Nil
    /\ cisr = Replicas
    /\ reports = {}
    /\ written = {}
    /\ writeAt = [v \in Values |-> <<Nil, 0>>]
    /\ acked = [v \in Values |-> 0]
    /\ cut = {}
    /\ silent = {}
    /\ excluded = Nil

-------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------------
(* High watermark: recomputed in the same step as whatever can move it     *)
(* (a follower's report, the leader's own flush or write).                 *)

\* What leader l counts as stored on r, given l's log lg, flushed fl, progress ps.
Stored(l, r, lg, fl, ps) ==
    IF r = l THEN (IF Bug = "written_hw" THEN Len(lg) ELSE fl)
    ELSE ps[r]

\* Offsets the leader may commit: stored on the required set, and (Raft's
\* rule) written in the leader's own epoch.
Committable(l, o, lg, fl, ps) ==
    /\ Bug = "old_epoch_commit" \/ lg[o][1] = epoch[l]
    /\ IF Policy = "quorum"
         THEN Cardinality({r \in Replicas : Stored(l, r, lg, fl, ps) >= o}) >= Q
         \* isr: a leader whose epoch the controller left (MoveOnReports) still counts
         \* itself; cisr \cup {l} is at most the ISR it knew, so no commit it made is missed.
         ELSE \A r \in cisr \cup {l} : Stored(l, r, lg, fl, ps) >= o

NewHW(l, lg, fl, ps) ==
    LET c == {o \in (hw[l] + 1)..Len(lg) : Committable(l, o, lg, fl, ps)}
    IN IF c = {} THEN hw[l] ELSE CHOOSE o \in c : \A p \in c : p <= o

\* Sets hw'[l] and acked' for leader l's new state. acks=all is released when
\* the HW passes the batch (isr: only while |ISR| >= min_insync_replicas,
\* otherwise NOT_ENOUGH_REPLICAS).
CommitTo(l, lg, fl, ps) ==
    LET h == NewHW(l, lg, fl, ps) IN
    /\ hw' = [hw EXCEPT ![l] = h]
    /\ acked' = [v \in Values |->
                   IF acked[v] = 0 /\ v \in Vals(Prefix(lg, h))
                      /\ (Policy = "quorum" \/ Cardinality(cisr \cup {l}) >= MinIsr)
                   THEN epoch[l] ELSE acked[v]]

----
(* Controller: elections as atomic decisions over the partition metadata. *)

replicaVars == <<log, flushed, crashes, epoch, kleader, lead, hw, pmatch, pstored>>

\* quorum, step 1: a record fencing the partition at e+1 with no leader.
Fence ==
    /\ Policy = "quorum" /\ Bug # "no_fence"
    /\ cepoch < MaxEpoch
    /\ cepoch' = cepoch + 1
    /\ cleader' = Nil
    /\ reports' = {}
    /\ silent' = {}
    /\ excluded' = Nil
    /\ UNCHANGED <<replicaVars, netVars, cisr, clientVars, cut>>

\* quorum, a replica's report. Correct: the replica learns the fence (so it
\* stops accepting the old epoch), flushes, and reports its flushed log; one
\* step, since a replica that has learned the fence takes no other step.
Report(r) ==
    /\ Policy = "quorum"
    /\ r \notin {x.r : x \in reports}
    /\ r # excluded    \* a report-triggered election refuses the old leader's report
    \* the controller elects as soon as n - q + 1 are in (the least it may know)
    /\ Cardinality(reports) < N - Q + 1
    /\ IF Bug = "no_fence"
         THEN \* reports gathered while the old leader keeps running
              /\ cepoch < MaxEpoch
              /\ UNCHANGED <<epoch, kleader, lead, hw, pmatch, pstored, cut>>
         ELSE /\ cepoch > 0 /\ cleader = Nil /\ epoch[r] <= cepoch
              /\ epoch' = [epoch EXCEPT ![r] = cepoch]
              /\ kleader' = [kleader EXCEPT ![r] = Nil]
              /\ lead' = [lead EXCEPT ![r] = FALSE]
              /\ hw' = [hw EXCEPT ![r] = 0]
              /\ pmatch' = [pmatch EXCEPT ![r] = [f \in Replicas |-> 0]]
              /\ pstored' = [pstored EXCEPT ![r] = [f \in Replicas |-> 0]]
    /\ IF Bug = "report_unflushed"
         THEN UNCHANGED flushed
         ELSE flushed' = [flushed EXCEPT ![r] = Len(log[r])]
    /\ reports' = reports \cup {[r |-> r, le |-> LastEpoch(log[r]), off |-> Len(log[r])]}
    /\ UNCHANGED <<log, crashes, netVars, cepoch, cleader, cisr, silent, excluded, clientVars, cut>>

\* Report order: (last epoch, end offset) as a pair; the KIP-250 bug uses end offset alone.
Beats(a, b) == IF Bug = "elect_by_leo" THEN a.off >= b.off
               ELSE a.le > b.le \/ (a.le = b.le /\ a.off >= b.off)

\* quorum, step 2: with n - q + 1 reports in, elect the greatest (ties: any).
ElectQuorum ==
    /\ Policy = "quorum"
    /\ Cardinality(reports) >= N - Q + 1
    /\ IF Bug = "no_fence" THEN cepoch < MaxEpoch ELSE cleader = Nil /\ cepoch > 0
    /\ \E x \in reports :
         /\ \A y \in reports : Beats(x, y)
         /\ cleader' = x.r
         /\ cepoch' = IF Bug = "no_fence" THEN cepoch + 1 ELSE cepoch
    /\ reports' = {}
    /\ excluded' = Nil
    /\ UNCHANGED <<replicaVars, netVars, cisr, silent, clientVars, cut>>

\* isr: one record electing a member of the ISR at e+1.
ElectIsr ==
    /\ Policy = "isr"
    /\ cepoch < MaxEpoch
    /\ \E r \in cisr :
         /\ cleader' = r
         /\ cepoch' = cepoch + 1
    /\ silent' = {}
    /\ UNCHANGED <<replicaVars, netVars, cisr, reports, excluded, clientVars, cut>>

\* isr: the leader's shrink/expand, accepted only at the current epoch. Atomic
\* here, so the leader's ISR view equals cisr (maximal ISR is in Controller.tla).
IsrShrink(l, f) ==
    /\ Policy = "isr" /\ lead[l] /\ epoch[l] = cepoch /\ cleader = l
    /\ f \in cisr /\ f # l
    /\ cisr' = cisr \ {f}
    /\ UNCHANGED <<replicaVars, netVars, cepoch, cleader, reports, silent, excluded, clientVars, cut>>

IsrExpand(l, f) ==
    /\ Policy = "isr" /\ lead[l] /\ epoch[l] = cepoch /\ cleader = l
    /\ f \notin cisr
    /\ pstored[l][f] >= hw[l]
    /\ pstored[l][f] >= EndFor(log[l], epoch[l] - 1)
    /\ cisr' = cisr \cup {f}
    /\ UNCHANGED <<replicaVars, netVars, cepoch, cleader, reports, silent, excluded, clientVars, cut>>

---------------------------------------------------------------------------
(* Replicas *)

\* A replica learns the controller's latest leader (brokers pull metadata).
\* Becoming leader appends the epoch-start entry; a replica that crashed while
\* leading has kleader = itself and never leads that epoch again.
Learn(r) ==
   
    /\ cepoch >= epoch[r]
    /\ <<cepoch, cleader>> # <<epoch[r], kleader[r]>>
    /\ epoch' = [epoch EXCEPT ![r] = cepoch]
    /\ kleader' = [kleader EXCEPT ![r] = cleader]
    /\ IF cleader = r
         THEN /\ lead' = [lead EXCEPT ![r] = TRUE]
              /\ log' = [log EXCEPT ![r] = Append(@, <<cepoch, Nil>>)]
              /\ pmatch' = [pmatch EXCEPT ![r] = [f \in Replicas |-> 0]]
              /\ pstored' = [pstored EXCEPT ![r] = [f \in Replicas |-> 0]]
              /\ hw' = [hw EXCEPT ![r] = 0]
         ELSE /\ lead' = [lead EXCEPT ![r] = FALSE]
              /\ hw' = [hw EXCEPT ![r] = 0]
              /\ pmatch' = [pmatch EXCEPT ![r] = [f \in Replicas |-> 0]]
              /\ pstored' = [pstored EXCEPT ![r] = [f \in Replicas |-> 0]]
              /\ UNCHANGED log
    /\ UNCHANGED <<flushed, crashes, netVars, ctrlVars, clientVars, cut>>

ClientWrite(l, v) ==
    /\ lead[l]
    /\ v \notin written
    /\ log' = [log EXCEPT ![l] = Append(@, <<epoch[l], v>>)]
    /\ written' = written \cup {v}
    /\ writeAt' = [writeAt EXCEPT ![v] = <<l, epoch[l]>>]
    /\ CommitTo(l, log'[l], flushed[l], pstored[l])
    /\ UNCHANGED <<flushed, crashes, epoch, kleader, lead, pmatch, pstored,
                   netVars, ctrlVars, cut>>

\* The leader's flush. A follower's flush is folded into its next step that
\* can observe it (its fetch, its report, a crash): flushing earlier and
\* doing nothing in between is the same behaviour.
Flush(r) ==
    /\ lead[r] /\ flushed[r] < Len(log[r])
    /\ flushed' = [flushed EXCEPT ![r] = Len(log[r])]
    /\ IF lead[r] THEN CommitTo(r, log[r], Len(log[r]), pstored[r])
                  ELSE UNCHANGED <<hw, acked, cut>>
    /\ UNCHANGED <<log, crashes, epoch, kleader, lead, pmatch, pstored,
                   netVars, ctrlVars, written, writeAt, cut>>

\* A crash and restart in one step: only the flushed prefix survives, and a
\* leader never leads that epoch again. (A replica that is down for a while
\* behaves like one that takes no steps, so "down" needs no state.)
Crash(r) ==
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    \* a follower may have flushed just before (see Flush)
    /\ \E keep \in IF lead[r] THEN {flushed[r]} ELSE {flushed[r], Len(log[r])} :
         /\ log' = [log EXCEPT ![r] = Prefix(@, keep)]
         /\ flushed' = [flushed EXCEPT ![r] = keep]
    /\ lead' = [lead EXCEPT ![r] = FALSE]
    /\ hw' = [hw EXCEPT ![r] = 0]
    /\ pmatch' = [pmatch EXCEPT ![r] = [f \in Replicas |-> 0]]
    /\ pstored' = [pstored EXCEPT ![r] = [f \in Replicas |-> 0]]
    /\ UNCHANGED <<epoch, kleader, netVars, ctrlVars, clientVars, cut>>

IsFollower(f) == ~lead[f] /\ kleader[f] \notin {Nil, f}

\* One exchange in flight per follower (a fetch session); a new one starts
\* when the last was answered or lost (timeout).
Idle(f) == \A m \in msgs : m.src # f /\ m.dst # f

ReqOf(f, lg, fl) == [type |-> "req", src |-> f, dst |-> kleader[f], e |-> epoch[f],
                     off |-> Len(lg), le |-> LastEpoch(lg), fl |-> fl]

\* Delivery consumes the message and sends the answers; up to MaxDups
\* deliveries keep it in flight to be delivered again (duplication).
Deliver(m, out) ==
    \/ /\ msgs' = (msgs \ {m}) \cup out
       /\ UNCHANGED dups
    \/ /\ dups < MaxDups
       /\ msgs' = msgs \cup out
       /\ dups' = dups + 1

\* Pull: the follower fetches from its log end. Push: heartbeat reply.
FollowerFetch(f) ==
    /\ Net = "messages" /\ IsFollower(f) /\ Idle(f)
    /\ \E fl \in {flushed[f], Len(log[f])} :     \* flush first, or not
         /\ flushed' = [flushed EXCEPT ![f] = fl]
         /\ msgs' = msgs \cup {ReqOf(f, log[f], fl)}
    /\ UNCHANGED <<log, crashes, epoch, kleader, lead, hw, pmatch, pstored,
                   dups, ctrlVars, clientVars, cut>>

\* What the leader counts toward the HW from one consistent (or not) report.
StoredFrom(m, consistent) ==
    CASE Bug = "flushed_beyond_match" -> m.fl
      [] Bug = "written_hw"           -> IF consistent THEN m.off ELSE 0
      [] OTHER                        -> IF consistent THEN Min(m.fl, m.off) ELSE 0

LeaderHandleReq(l, m) ==
    /\ m.type = "req" /\ m.dst = l /\ lead[l] /\ <<m.src, l>> \notin cut
    /\ m.e >= epoch[l]
    /\ IF m.e > epoch[l]
         THEN \* a follower knows a newer epoch: stop leading
              /\ lead' = [lead EXCEPT ![l] = FALSE]
              /\ Deliver(m, {})
              /\ pmatch' = [pmatch EXCEPT ![l] = [f \in Replicas |-> 0]]
              /\ pstored' = [pstored EXCEPT ![l] = [f \in Replicas |-> 0]]
              /\ hw' = [hw EXCEPT ![l] = 0]
              /\ UNCHANGED acked
         ELSE
         LET f == m.src
             consistent == m.off <= Len(log[l]) /\ EpochAt(log[l], m.off) = m.le
             de == EpochAt(log[l], EndFor(log[l], m.le))
             ps == [pstored[l] EXCEPT ![f] = Max(@, StoredFrom(m, consistent))]
         IN /\ pstored' = [pstored EXCEPT ![l] = ps]
            /\ CommitTo(l, log[l], flushed[l], ps)
            /\ IF consistent
                 THEN /\ pmatch' = IF Mode = "push" THEN [pmatch EXCEPT ![l][f] = m.off]
                                   ELSE pmatch
                      /\ Deliver(m, {[type |-> "data", src |-> l, dst |-> f, e |-> epoch[l],
                               prev |-> m.off, pe |-> m.le,
                               ent |-> Next1(log[l], m.off)]})
                 ELSE /\ UNCHANGED pmatch
                      /\ Deliver(m, {[type |-> "div", src |-> l, dst |-> f, e |-> epoch[l],
                               off |-> m.off, le |-> m.le,
                               de |-> de, doff |-> EndFor(log[l], m.le)]})
            /\ UNCHANGED lead
    /\ UNCHANGED <<log, flushed, crashes, epoch, kleader, ctrlVars, written, writeAt, cut>>

\* Push: the leader sends the entry after the follower's confirmed match.
LeaderPush(l, f) ==
    /\ Net = "messages" /\ Mode = "push" /\ lead[l] /\ f # l /\ Idle(f)
    /\ pmatch[l][f] < Len(log[l])
    /\ msgs' = msgs \cup {[type |-> "data", src |-> l, dst |-> f, e |-> epoch[l],
                           prev |-> pmatch[l][f], pe |-> EpochAt(log[l], pmatch[l][f]),
                           ent |-> Next1(log[l], pmatch[l][f])]}
    /\ UNCHANGED <<log, flushed, crashes, epoch, kleader, lead, hw, pmatch, pstored,
                   dups, ctrlVars, clientVars, cut>>

\* The Raft consistency check: entries are accepted only after a matching
\* (offset, epoch); a conflicting suffix is replaced, a matching one kept.
FollowerHandleData(f, m) ==
    /\ m.type = "data" /\ m.dst = f /\ IsFollower(f) /\ m.e = epoch[f] /\ <<m.src, f>> \notin cut
    /\ m.prev <= Len(log[f]) /\ EpochAt(log[f], m.prev) = m.pe
    /\ LET n == m.prev + Len(m.ent)
           \* keep the log if it already holds these entries (a duplicate)
           same == Len(log[f]) >= n /\ SubSeq(log[f], m.prev + 1, n) = m.ent
           nlog == IF same THEN log[f] ELSE Prefix(log[f], m.prev) \o m.ent
           kept == Min(flushed[f], IF nlog = log[f] THEN Len(log[f]) ELSE m.prev)
       IN /\ log' = [log EXCEPT ![f] = nlog]
          \* lazy flush, or flush_after_append before replying
          /\ \E nfl \in {kept, Len(nlog)} :
               /\ flushed' = [flushed EXCEPT ![f] = nfl]
               /\ Deliver(m, {ReqOf(f, nlog, nfl)})
    /\ UNCHANGED <<hw, crashes, epoch, kleader, lead, pmatch, pstored, ctrlVars,
                   clientVars, cut>>

\* Divergence: truncate to where the follower's last epoch ends in the leader's
\* log (bounded by where that epoch ends locally). Applied only if the log is
\* still as it was when the request was sent, so a stale answer cannot cut
\* entries appended since.
FollowerHandleDiv(f, m) ==
    /\ m.type = "div" /\ m.dst = f /\ IsFollower(f) /\ m.e = epoch[f] /\ <<m.src, f>> \notin cut
    /\ Len(log[f]) = m.off /\ LastEpoch(log[f]) = m.le
    /\ LET n == Min(m.doff, EndFor(log[f], m.de))
       IN /\ n < Len(log[f])
          /\ log' = [log EXCEPT ![f] = Prefix(@, n)]
          /\ flushed' = [flushed EXCEPT ![f] = Min(@, n)]
          /\ Deliver(m, {ReqOf(f, Prefix(log[f], n), Min(flushed[f], n))})
    /\ UNCHANGED <<hw, crashes, epoch, kleader, lead, pmatch, pstored, ctrlVars,
                   clientVars, cut>>

\* Net = "atomic": one whole fetch exchange in one step (request, leader's
\* handling, follower's handling of the answer), with nothing lost. Its
\* behaviours are a subset of the message network's, so a violation found
\* here is one there too; it is what lets the larger models stay small.
\* fl: the follower's flushed offset as it fetches (it may flush first).
ExchangeWith(f, fl) ==
    /\ Net = "atomic" /\ IsFollower(f)
    /\ LET l == kleader[f]
           m == ReqOf(f, log[f], fl)
           consistent == m.off <= Len(log[l]) /\ EpochAt(log[l], m.off) = m.le
           ps == [pstored[l] EXCEPT ![f] = Max(@, StoredFrom(m, consistent))]
           n == Min(EndFor(log[l], m.le), EndFor(log[f], EpochAt(log[l], EndFor(log[l], m.le))))
       IN /\ lead[l] /\ epoch[l] = epoch[f]
          /\ <<f, l>> \notin cut /\ <<l, f>> \notin cut
          /\ pstored' = [pstored EXCEPT ![l] = ps]
          /\ CommitTo(l, log[l], flushed[l], ps)
          /\ IF consistent
               THEN /\ m.off < Len(log[l]) \/ ps # pstored[l]
                    /\ log' = [log EXCEPT ![f] = @ \o Next1(log[l], m.off)]
                    /\ flushed' = [flushed EXCEPT ![f] = fl]
               ELSE /\ log' = [log EXCEPT ![f] = Prefix(@, n)]
                    /\ flushed' = [flushed EXCEPT ![f] = Min(fl, n)]
    /\ UNCHANGED <<crashes, epoch, kleader, lead, pmatch, netVars, ctrlVars, written, writeAt, cut>>

Exchange(f) == \E fl \in {flushed[f], Len(log[f])} : ExchangeWith(f, fl)

\* Loss, and the receiver discarding a message of another epoch.
Drop(m) ==
    /\ msgs' = msgs \ {m}
    /\ UNCHANGED <<replicaVars, dups, ctrlVars, clientVars, cut>>

---------------------------------------------------------------------------
(* Gray failures: asymmetric reachability and the data plane's reports.   *)
(* A directed link is cut (messages from a to b are dropped; the other     *)
(* way may work) and healed again; the controller reaches everyone. A      *)
(* replica whose leader (or, leading, whose follower) is behind a cut one   *)
(* way or the other reports the link silent for its current epoch; the      *)
(* controller keeps reports for its current epoch only. When the leader's   *)
(* linked followers cannot commit, the controller moves the leadership      *)
(* (controller/decisions/reachability.py): quorum fences the epoch and      *)
(* elects from n - q + 1 reports, refusing the old leader's; isr moves it    *)
(* to an in-sync follower that reported, the old leader leaving the ISR.    *)

\* Only links of the current leader are cut: messages travel between a leader
\* and its followers only, so a cut between two followers changes nothing until
\* one of them leads, and leaving those out keeps the models small.
Cut(a, b) ==
    /\ a # b /\ <<a, b>> \notin cut /\ Cardinality(cut) < MaxCuts
    /\ cleader \in {a, b}
    /\ cut' = cut \cup {<<a, b>>}
    /\ UNCHANGED <<replicaVars, netVars, ctrlVars, clientVars>>

Heal(a, b) ==
    /\ <<a, b>> \in cut
    /\ cut' = cut \ {<<a, b>>}
    /\ UNCHANGED <<replicaVars, netVars, ctrlVars, clientVars>>

Peer(r, p) == (IsFollower(r) /\ kleader[r] = p) \/ (lead[r] /\ p # r)

Complain(r, p) ==
    /\ Peer(r, p) /\ epoch[r] = cepoch
    /\ <<r, p>> \in cut \/ <<p, r>> \in cut
    /\ [r |-> r, p |-> p, e |-> cepoch] \notin silent
    /\ silent' = silent \cup {[r |-> r, p |-> p, e |-> cepoch]}
    /\ UNCHANGED <<replicaVars, netVars, cepoch, cleader, cisr, reports, excluded, clientVars, cut>>

\* Followers whose link with leader l either end reported silent.
Broken(l) == {f \in Replicas \ {l} : [r |-> f, p |-> l, e |-> cepoch] \in silent
                                     \/ [r |-> l, p |-> f, e |-> cepoch] \in silent}
Reporters(l) == {f \in Replicas \ {l} : [r |-> f, p |-> l, e |-> cepoch] \in silent}
\* Followers l itself reports silent.
Reported(l) == {f \in Replicas \ {l} : [r |-> l, p |-> f, e |-> cepoch] \in silent}
\* Replicas saying l is cut off: followers reporting it, and l when it reports most followers.
Votes(l) == Cardinality(Reporters(l)) + (IF 2 * Cardinality(Reported(l)) > N - 1 THEN 1 ELSE 0)
\* l counts as cut off: a majority says so, or l hears from no majority of its followers
\* (Raft's check-quorum; every replica here heartbeats).
CutOff(l) == 2 * Votes(l) > N \/ 2 * Cardinality(Reported(l)) > N - 1
\* isr: in-sync followers to move to: those reporting l, else those l reports.
Candidates(l) == IF Reporters(l) \cap cisr # {} THEN Reporters(l) \cap cisr ELSE Reported(l) \cap cisr

\* quorum: the leader and its linked followers are fewer than q.
FenceOnReports ==
    /\ Policy = "quorum" /\ cleader # Nil /\ cepoch < MaxEpoch
    /\ CutOff(cleader)
    /\ 1 + Cardinality((Replicas \ {cleader}) \ Broken(cleader)) < Q
    /\ N - 1 >= Max(Q, N - Q + 1)
    /\ IF Bug = "elect_unfenced"
         THEN \* BROKEN: straight to a follower that reported the leader, without
              \* the fence and its reports
              /\ \E f \in Reporters(cleader) : cleader' = f
              /\ UNCHANGED excluded
         ELSE /\ cleader' = Nil
              /\ excluded' = cleader
    /\ cepoch' = cepoch + 1
    /\ reports' = {}
    /\ silent' = {}
    /\ UNCHANGED <<replicaVars, netVars, cisr, clientVars, cut>>

\* isr: the leader and its linked in-sync followers are fewer than min_insync_replicas.
MoveOnReports ==
    /\ Policy = "isr" /\ cleader # Nil /\ cepoch < MaxEpoch
    /\ CutOff(cleader)
    /\ 1 + Cardinality((cisr \ {cleader}) \ Broken(cleader)) < MinIsr
    \* The others (all heartbeat here) can meet MinIsr once they catch up with the new leader.
    /\ N - 1 >= MinIsr
    /\ \E f \in Candidates(cleader) : cleader' = f
    /\ cisr' = cisr \ {cleader}
    /\ cepoch' = cepoch + 1
    /\ silent' = {}
    /\ UNCHANGED <<replicaVars, netVars, reports, excluded, clientVars, cut>>

---------------------------------------------------------------------------
\* Message deliveries, named so that traces show which step was taken.
ReceiveReq == \E m \in msgs : LeaderHandleReq(m.dst, m)
ReceiveData == \E m \in msgs : FollowerHandleData(m.dst, m)
ReceiveDiv == \E m \in msgs : FollowerHandleDiv(m.dst, m)
Lose == \E m \in msgs : Drop(m)

Next ==
    \/ Fence \/ ElectQuorum \/ ElectIsr \/ FenceOnReports \/ MoveOnReports
    \/ \E a, b \in Replicas : Cut(a, b) \/ Heal(a, b) \/ Complain(a, b)
    \/ \E r \in Replicas :
         \/ Report(r) \/ Learn(r) \/ Flush(r) \/ Crash(r) \/ FollowerFetch(r) \/ Exchange(r)
         \/ \E v \in Values : ClientWrite(r, v)
         \/ \E f \in Replicas : LeaderPush(r, f) \/ IsrShrink(r, f) \/ IsrExpand(r, f)
    \/ ReceiveReq \/ ReceiveData \/ ReceiveDiv \/ Lose

Spec == Init /\ [][Next]_vars

\* Keeps the network bounded; behaviours needing more messages in flight are cut.
MsgConstraint == Cardinality(msgs) <= MaxMsgs

Symmetry == Permutations(Replicas) \cup Permutations(Values)

---------------------------------------------------------------------------
(* Invariants (docs/design.md, "Testing") *)

\* No acknowledged record is lost: it stays durable somewhere ...
NoAckedLoss ==
    \A v \in Values : IsAcked(v) => \E r \in Replicas : v \in Vals(Prefix(log[r], flushed[r]))

\* ... and every leader of a later (or the same) epoch holds it.
LeaderCompleteness ==
    \A r \in Replicas, v \in Values :
        lead[r] /\ IsAcked(v) /\ acked[v] <= epoch[r] => v \in Vals(log[r])

\* Logs agree up to the lower of two replicas' HWs.
LogMatching ==
    \A r, s \in Replicas :
        \A o \in 1..Min(hw[r], hw[s]) : log[r][o] = log[s][o]

\* The same (offset, epoch) holds the same entry everywhere.
EpochMatching ==
    \A r, s \in Replicas :
        \A o \in 1..Min(Len(log[r]), Len(log[s])) :
            log[r][o][1] = log[s][o][1] => log[r][o] = log[s][o]

\* At most one leader (so at most one committing leader) per epoch.
OneLeaderPerEpoch ==
    \A r, s \in Replicas : lead[r] /\ lead[s] /\ epoch[r] = epoch[s] => r = s

HWBelowLogEnd == \A r \in Replicas : hw[r] <= Len(log[r])

Safety == NoAckedLoss /\ LeaderCompleteness /\ LogMatching /\ EpochMatching
          /\ OneLeaderPerEpoch /\ HWBelowLogEnd

\* Action properties: the HW never goes back on a leader; epochs only grow.
HWMonotonic ==
    [][\A r \in Replicas : lead[r] /\ lead'[r] /\ epoch'[r] = epoch[r] => hw'[r] >= hw[r]]_vars

EpochsGrow ==
    [][/\ cepoch' >= cepoch
       /\ \A r \in Replicas : epoch'[r] >= epoch[r]]_vars

---------------------------------------------------------------------------
(* Liveness (small model, no symmetry): once faults stop, a write is either *)
(* acknowledged or its leader stops leading that epoch (the producer gets   *)
(* NOT_LEADER and retries).                                                 *)

StillLeading(v) == LET l == writeAt[v][1] IN
                   l # Nil /\ lead[l] /\ epoch[l] = writeAt[v][2]

\* Fair: learning metadata, the leader's flush, and (atomic network) a
\* follower's flush-and-fetch. Faults (crashes) are bounded, so they stop.
LiveSpec ==
    /\ Spec
    /\ \A r \in Replicas :
         /\ WF_vars(Learn(r))
         /\ WF_vars(Flush(r))
         \* unfair_fetch: followers may stop fetching, so liveness must fail
         /\ Bug = "unfair_fetch" \/ WF_vars(ExchangeWith(r, Len(log[r])))

WriteResolved ==
    \A v \in Values : v \in written ~> (IsAcked(v) \/ ~StillLeading(v))
=============================================================================
