// Options of a campaign: the candidate's identity and the election's timing.
package io.consistd.client;

import com.google.protobuf.Duration;
import consistd.v1.Leadership.LeaseTiming;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * One option of {@link Leadership#campaign}, e.g. {@code CampaignOption.identity("worker-1")}. Of two of the same
 * kind, the later wins.
 */
public final class CampaignOption {
  /** Every option of one campaign. */
  static final class Settings {
    String identity = "";
    LeaseTiming timing;

    static Settings of(CampaignOption... options) {
      Settings settings = new Settings();
      for (CampaignOption option : options) {
        option.apply.accept(settings);
      }
      return settings;
    }
  }

  private final Consumer<Settings> apply;

  private CampaignOption(Consumer<Settings> apply) {
    this.apply = apply;
  }

  /** Campaigns under this identity instead of the sidecar's own (by default the pod's name). */
  public static CampaignOption identity(String identity) {
    Objects.requireNonNull(identity, "identity");
    return new CampaignOption(s -> s.identity = identity);
  }

  /**
   * The election's timing; a null or zero duration takes the daemon's default (client-go's: 15 s, 10 s, 2 s). The
   * daemon wants {@code retryPeriod < renewDeadline < leaseDuration} (INVALID_ARGUMENT naming {@code timing}).
   *
   * @param leaseDuration how long a Lease stays valid after its last renewal
   * @param renewDeadline how long a leader may fail to renew before it stops reporting LEADER
   * @param retryPeriod how often candidates try to acquire and leaders renew
   */
  public static CampaignOption timing(
      java.time.Duration leaseDuration, java.time.Duration renewDeadline, java.time.Duration retryPeriod) {
    LeaseTiming.Builder timing = LeaseTiming.newBuilder();
    if (set(leaseDuration)) {
      timing.setLeaseDuration(proto(leaseDuration));
    }
    if (set(renewDeadline)) {
      timing.setRenewDeadline(proto(renewDeadline));
    }
    if (set(retryPeriod)) {
      timing.setRetryPeriod(proto(retryPeriod));
    }
    LeaseTiming built = timing.build();
    return new CampaignOption(s -> s.timing = built);
  }

  private static boolean set(java.time.Duration d) {
    return d != null && !d.isZero();
  }

  private static Duration proto(java.time.Duration d) {
    return Duration.newBuilder().setSeconds(d.getSeconds()).setNanos(d.getNano()).build();
  }
}
