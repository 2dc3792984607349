"""The pieces every process shares: one epoch comparison, one TopicPartition."""
from common.epochs import EpochCheck, check_epoch, leader_epoch_error
from common.errors import ErrorCode


def test_leader_epoch_error_answers_each_comparison():
    """Claim: a requester's older leader epoch is fenced, a newer one unknown, the same one fine."""
    assert leader_epoch_error(check_epoch(theirs=3, ours=4)) is ErrorCode.FENCED_LEADER_EPOCH
    assert leader_epoch_error(check_epoch(theirs=4, ours=4)) is ErrorCode.NONE
    assert leader_epoch_error(check_epoch(theirs=5, ours=4)) is ErrorCode.UNKNOWN_LEADER_EPOCH


def test_old_fencing_module_is_the_same_comparison():
    """Claim: dataplane.replica.fencing re-exports common.epochs, so there is one enum."""
    from dataplane.replica import fencing
    assert fencing.EpochCheck is EpochCheck and fencing.check_epoch is check_epoch


def test_topic_partition_is_one_class_and_equals_the_plain_pair():
    """Claim: the SDK's TopicPartition is common's, and it keys a dict like ("t", 0)."""
    from common.topic_partition import TopicPartition
    from dataplane.client import TopicPartition as ClientTopicPartition
    assert ClientTopicPartition is TopicPartition
    assert {("t", 0): 1}[TopicPartition("t", 0)] == 1 and str(TopicPartition("t", 0)) == "t[0]"
