// The status of a Kubernetes status condition: True, False or Unknown.
package io.consistd.client;

/**
 * The status of one condition of an object's status.conditions, as metav1.Condition has it ({@link
 * WorkItem#setCondition}, {@link ObjectsClient#setCondition}).
 */
public enum ConditionStatus {
  /** "True". */
  TRUE,
  /** "False". */
  FALSE,
  /** "Unknown". */
  UNKNOWN;

  consistd.v1.Objects.ConditionStatus toProto() {
    return switch (this) {
      case TRUE -> consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_TRUE;
      case FALSE -> consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_FALSE;
      case UNKNOWN -> consistd.v1.Objects.ConditionStatus.CONDITION_STATUS_UNKNOWN;
    };
  }
}
