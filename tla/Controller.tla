---------------------------- MODULE Controller ----------------------------
(***************************************************************************)
(* The controller's decisions for one partition, as atomic actions over    *)
(* the metadata (the controller is a replicated state machine; its Raft is *)
(* not modelled). The data plane is abstracted to one bit per broker:      *)
(* has[b] = "b holds every committed record". A commit by the leader       *)
(* clears it on every broker outside the set the commit counted; catching  *)
(* up sets it. DataPlane.tla shows that the greatest flushed (last epoch,  *)
(* end offset) report has every committed record; here the quorum election *)
(* is reduced to "a reporter that has them wins, if any reporter does".    *)
(* Durability = "write" adds Crash(b): b restarts having lost what it had  *)
(* not flushed, which the commit rule counted (has[b] is cleared), and it  *)
(* stays unclean until it catches up with a leader or leads. An unclean    *)
(* replica reports too, but its report is not one of the n - q + 1: the    *)
(* election needs n - q + 1 clean reports or a report from every replica.  *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Brokers,       \* broker ids (model values)
    InitReplicas,  \* the partition's initial replica set
    Targets,       \* replica sets a reassignment may move to
    Nil,
    Q,             \* quorum_required_acks
    MinIsr,        \* min_insync_replicas
    Policy,        \* "isr" | "quorum"
    MaxEpoch,      \* bound on the partition epoch
    Durability,    \* "fsync" | "write" (write: quorum policy only)
    Bug            \* "none" | "stale_isr" | "shrink_early" | "few_reports"
                   \* | "count_unclean" | "silent_unclean" | "settle_unknown"

ASSUME /\ Policy \in {"isr", "quorum"}
       /\ Durability \in {"fsync", "write"}
       /\ Durability = "write" => Policy = "quorum"
       /\ Bug \in {"none", "stale_isr", "shrink_early", "few_reports", "count_unclean", "silent_unclean",
                  "settle_unknown"}
       /\ InitReplicas \subseteq Brokers
       /\ Nil \notin Brokers

VARIABLES
    fenced,     \* brokers whose session expired
    replicas,   \* current replica set (adding ones included while reassigning)
    target,     \* reassignment target, or {} when none
    isr,        \* in-sync replicas (metadata)
    leader,     \* leader, or Nil
    lepoch,     \* leader epoch
    pepoch,     \* partition epoch: bumped by every change
    reports,    \* quorum election: brokers that reported since the fence
    lview,      \* the leader's view: [le, pe, isr] of its last accepted state
    proposals,  \* AlterPartition requests in flight: [le, pe, isr]
    pending,    \* the ISR the leader proposed and awaits (or lview.isr)
    has,        \* has[b]: b holds every committed record
    unclean     \* write: restarted after a crash, not caught up with a leader since

vars == <<fenced, replicas, target, isr, leader, lepoch, pepoch, reports, lview,
          proposals, pending, has, unclean>>

N == Cardinality(InitReplicas)

TypeOK ==
    /\ fenced \subseteq Brokers
    /\ replicas \subseteq Brokers /\ target \subseteq Brokers
    /\ isr \subseteq Brokers
    /\ leader \in Brokers \cup {Nil}
    /\ lepoch \in Nat /\ pepoch \in 0..MaxEpoch
    /\ reports \subseteq Brokers
    /\ has \in [Brokers -> BOOLEAN]
    /\ unclean \subseteq Brokers

Init ==
    /\ fenced = {}
    /\ replicas = InitReplicas
    /\ target = {}
    /\ isr = InitReplicas
    /\ leader \in InitReplicas
    /\ lepoch = 0 /\ pepoch = 0
    /\ reports = {}
    /\ lview = [le |-> 0, pe |-> 0, isr |-> InitReplicas]
    /\ proposals = {}
    /\ pending = InitReplicas
    /\ has = [b \in Brokers |-> TRUE]
    /\ unclean = {}

\* A new leader (or none) at the next epochs; the leader's view restarts.
NewLeader(l) ==
    /\ leader' = l
    /\ lepoch' = lepoch + 1
    /\ lview' = [le |-> lepoch + 1, pe |-> pepoch + 1, isr |-> isr']
    /\ pending' = isr'
    /\ UNCHANGED proposals   \* the old leader's requests may still arrive

\* The ISR the leader counts for its HW: the maximal ISR, i.e. the accepted
\* one together with the one it proposed, until the answer arrives.
CountedIsr == IF Bug = "shrink_early" THEN pending ELSE lview.isr \cup pending

\* isr election: a live member of the ISR (unclean election is not allowed).
IsrCandidates(excl) == (isr \ fenced) \ {excl}

---------------------------------------------------------------------------
(* Broker lifecycle *)

\* Session timeout, or registering again after a crash: the broker is fenced, leaves every ISR (but the last
\* member stays so that the ISR still names who holds the data) and loses
\* its leadership. isr: one record electing from the ISR. quorum: the
\* record fences the partition at e+1 with no leader (the two-step election).
Fence(b) ==
    /\ pepoch < MaxEpoch
    /\ fenced' = fenced \cup {b}
    /\ isr' = IF isr = {b} THEN isr ELSE isr \ {b}
    /\ pepoch' = pepoch + 1
    /\ IF leader = b
         THEN IF Policy = "isr"
                THEN \E l \in IsrCandidates(b) \cup {Nil} :
                       /\ (l = Nil) = (IsrCandidates(b) = {})
                       /\ NewLeader(l)
                ELSE NewLeader(Nil)
         ELSE UNCHANGED <<leader, lepoch, lview, pending, proposals>>
    /\ reports' = {}
    /\ UNCHANGED <<replicas, target>>

\* Session timeout.
FenceBroker(b) == b \notin fenced /\ Fence(b) /\ UNCHANGED <<has, unclean>>

\* write: kill -9 and restart. The broker registers again (fenced, out of the
\* ISR, leadership lost: the same record as a fence) and what it had not
\* flushed is gone: it may miss committed records.
Crash(b) ==
    /\ Durability = "write" /\ b \in replicas
    /\ Fence(b)
    /\ has' = [has EXCEPT ![b] = FALSE]
    /\ unclean' = unclean \cup {b}

Unfence(b) ==
    /\ b \in fenced
    /\ fenced' = fenced \ {b}
    /\ UNCHANGED <<replicas, target, isr, leader, lepoch, pepoch, reports, lview,
                   proposals, pending, has, unclean>>

---------------------------------------------------------------------------
(* Data plane, abstracted *)

\* The leader commits: every broker outside the counted set may miss it.
Commit ==
    /\ leader # Nil /\ leader \notin fenced
    /\ \E S \in SUBSET replicas :
         /\ leader \in S
         /\ \A b \in S : has[b]
         /\ IF Policy = "isr" THEN CountedIsr \subseteq S /\ Cardinality(CountedIsr) >= MinIsr
                              ELSE Cardinality(S) >= Q
         /\ has' = [b \in Brokers |-> b \in S]
    /\ UNCHANGED <<fenced, replicas, target, isr, leader, lepoch, pepoch, reports, lview,
                   proposals, pending, unclean>>

\* From the leader, which can only pass on what it has.
CatchUp(b) ==
    /\ leader # Nil /\ has[leader] /\ b \in replicas /\ b \notin fenced
    /\ ~has[b] \/ b \in unclean
    /\ has' = [has EXCEPT ![b] = TRUE]
    /\ unclean' = unclean \ {b}
    /\ UNCHANGED <<fenced, replicas, target, isr, leader, lepoch, pepoch, reports, lview,
                   proposals, pending>>

---------------------------------------------------------------------------
(* ISR changes: proposed by the leader, decided by the controller *)

Propose(newIsr) ==
    /\ leader # Nil /\ leader \notin fenced /\ pending = lview.isr
    /\ newIsr # lview.isr /\ leader \in newIsr
    /\ pending' = newIsr
    /\ proposals' = proposals \cup {[le |-> lview.le, pe |-> lview.pe, isr |-> newIsr]}
    /\ UNCHANGED <<fenced, replicas, target, isr, leader, lepoch, pepoch, reports, lview, has, unclean>>

\* Shrink: a follower fell behind (replica_lag_time_max).
ProposeShrink(b) == b \in lview.isr /\ b # leader /\ Propose(lview.isr \ {b})

\* Expand: a replica reached the HW (has every committed record).
ProposeExpand(b) == b \in replicas \ lview.isr /\ has[b] /\ b \notin fenced
                    /\ Propose(lview.isr \cup {b})

\* Accepted only at the current leader and partition epochs. The answer
\* goes to the proposer: the current leader learns the resulting state; a
\* request of an earlier leader changes nothing in the current leader's view
\* (answering it there would drop the current leader's own pending request).
AlterIsr ==
    \E p \in proposals :
      /\ proposals' = proposals \ {p}
      /\ IF (p.le = lepoch /\ p.pe = pepoch) \/ Bug = "stale_isr"
           THEN /\ pepoch < MaxEpoch
                /\ isr' = p.isr \cap replicas
                /\ pepoch' = pepoch + 1
                /\ IF p.le = lepoch
                     THEN /\ lview' = [le |-> lepoch, pe |-> pepoch + 1, isr |-> isr']
                          /\ pending' = isr'
                     ELSE UNCHANGED <<lview, pending>>
           ELSE /\ UNCHANGED <<isr, pepoch>>
                /\ IF p.le = lepoch
                     THEN /\ lview' = [le |-> lepoch, pe |-> pepoch, isr |-> isr]
                          /\ pending' = isr
                     ELSE UNCHANGED <<lview, pending>>
      /\ UNCHANGED <<fenced, replicas, target, leader, lepoch, reports, has, unclean>>

\* Accepted, but the answer says only "timed out": the controller lost its
\* leadership before answering, and the next one committed the change. The
\* leader's view stays as it was and it keeps counting its proposal until
\* metadata brings the outcome (LearnMetadata). The settle_unknown bug takes
\* the answer for a refusal and counts the old ISR alone: the joiner, now in
\* the controller's ISR, may miss what the leader commits.
AlterIsrUnknown ==
    \E p \in proposals :
      /\ p.le = lepoch /\ p.pe = pepoch /\ pepoch < MaxEpoch
      /\ proposals' = proposals \ {p}
      /\ isr' = p.isr \cap replicas
      /\ pepoch' = pepoch + 1
      /\ IF Bug = "settle_unknown" THEN pending' = lview.isr ELSE UNCHANGED pending
      /\ UNCHANGED <<fenced, replicas, target, leader, lepoch, reports, lview, has, unclean>>

\* Metadata reaches the leader: a newer partition epoch settles any proposal
\* (accepted, or overtaken), and the leader counts the controller's ISR.
LearnMetadata ==
    /\ leader # Nil /\ lview.le = lepoch /\ lview.pe < pepoch
    /\ lview' = [le |-> lepoch, pe |-> pepoch, isr |-> isr]
    /\ pending' = isr
    /\ UNCHANGED <<fenced, replicas, target, isr, leader, lepoch, pepoch, reports, proposals, has, unclean>>

\* One request in flight at a time (the current or an earlier leader's) keeps
\* the model small; the stale-request case needs no more.
ProposalBound == Cardinality(proposals) <= 1

---------------------------------------------------------------------------
(* quorum: the two-step election *)

\* An unclean replica reports as well (it is unclean in reports \cap unclean:
\* it cannot turn clean while there is no leader). The silent_unclean bug is
\* the rule before: it reports only once it has caught up with a leader.
Report(b) ==
    /\ Policy = "quorum" /\ leader = Nil
    /\ b \in replicas /\ b \notin fenced /\ b \notin reports
    /\ Bug = "silent_unclean" => b \notin unclean
    /\ reports' = reports \cup {b}
    /\ UNCHANGED <<fenced, replicas, target, isr, leader, lepoch, pepoch, lview,
                   proposals, pending, has, unclean>>

\* n - q + 1 clean reports intersect every commit quorum of q in a replica
\* that kept the record. A report from every replica: none holds more than
\* the best reporter. The few_reports bug elects after n - q reports, the
\* count_unclean bug counts unclean reports among the n - q + 1.
EnoughReports ==
    CASE Bug = "few_reports"   -> Cardinality(reports) >= N - Q
      [] Bug = "count_unclean" -> Cardinality(reports) >= N - Q + 1
      [] OTHER -> Cardinality(reports \ unclean) >= N - Q + 1 \/ replicas \subseteq reports

\* The elected replica's log is the one all follow: it is clean from now on.
ElectQuorum ==
    /\ Policy = "quorum" /\ leader = Nil /\ pepoch < MaxEpoch
    /\ EnoughReports
    /\ \E l \in reports :
         /\ has[l] \/ \A r \in reports : ~has[r]
         /\ isr' = isr
         /\ pepoch' = pepoch + 1
         /\ leader' = l
         /\ lview' = [le |-> lepoch, pe |-> pepoch + 1, isr |-> isr]
         /\ pending' = isr
         /\ unclean' = unclean \ {l}
    /\ reports' = {}
    /\ UNCHANGED <<fenced, replicas, target, lepoch, proposals, has>>

---------------------------------------------------------------------------
(* Reassignment (isr policy): grow, catch up, shrink *)

Grow(t) ==
    /\ Policy = "isr" /\ target = {} /\ t # replicas /\ pepoch < MaxEpoch
    /\ target' = t
    /\ replicas' = replicas \cup t
    /\ pepoch' = pepoch + 1
    /\ UNCHANGED <<fenced, isr, leader, lepoch, reports, lview, proposals, pending, has, unclean>>

\* Shrink once every target replica is in the ISR; re-elect if the leader leaves.
Shrink ==
    /\ target # {} /\ target \subseteq isr /\ pepoch < MaxEpoch
    /\ replicas' = target
    /\ target' = {}
    /\ isr' = isr \cap target
    /\ pepoch' = pepoch + 1
    /\ IF leader \in target
         THEN UNCHANGED <<leader, lepoch, lview, pending, proposals>>
         ELSE \E l \in (isr' \ fenced) : NewLeader(l)
    /\ UNCHANGED <<fenced, reports, has, unclean>>

---------------------------------------------------------------------------
Next ==
    \/ \E b \in Brokers : FenceBroker(b) \/ Crash(b) \/ Unfence(b) \/ CatchUp(b) \/ Report(b)
                          \/ ProposeShrink(b) \/ ProposeExpand(b)
    \/ Commit \/ AlterIsr \/ AlterIsrUnknown \/ LearnMetadata \/ ElectQuorum \/ Shrink
    \/ \E t \in Targets : Grow(t)

Spec == Init /\ [][Next]_vars

Symmetry == Permutations(Brokers)

---------------------------------------------------------------------------
(* Invariants *)

\* The ISR the controller elects from holds every committed record.
IsrComplete == Policy = "isr" => \A b \in isr : has[b]

\* Every committed record is gone from every replica: only under write, after
\* crashes of every replica that held it (beyond what write promises).
Lost == \A b \in Brokers : ~has[b]

\* Leader completeness: a leader holds every committed record (unless no
\* replica does any more).
LeaderComplete == leader # Nil => has[leader] \/ Lost

\* An election is never stuck: with every replica unfenced (up and connected)
\* and every report that can be made made, a leader can be elected.
ElectionLive ==
    (Policy = "quorum" /\ leader = Nil /\ pepoch < MaxEpoch /\ replicas \cap fenced = {}
     /\ ~\E b \in Brokers : ENABLED Report(b))
    => ENABLED ElectQuorum

LeaderInIsr == Policy = "isr" /\ leader # Nil => leader \in isr

IsrInReplicas == isr \subseteq replicas /\ isr # {}

EpochsGrow == [][pepoch' >= pepoch /\ lepoch' >= lepoch]_vars

\* An ISR change is accepted only with the current epochs.
NoStaleIsrChange ==
    [][isr' # isr /\ leader' = leader /\ replicas' = replicas /\ fenced' = fenced
        => \E p \in proposals : p.le = lepoch /\ p.pe = pepoch /\ isr' = p.isr \cap replicas]_vars
=============================================================================
