// The Java Operator SDK side of the Kopf comparison.
package io.consistd.bench.josdk;

import io.fabric8.kubernetes.api.model.ConfigMap;
import io.fabric8.kubernetes.api.model.ConfigMapBuilder;
import io.javaoperatorsdk.operator.Operator;
import io.javaoperatorsdk.operator.api.config.informer.Informer;
import io.javaoperatorsdk.operator.api.reconciler.Context;
import io.javaoperatorsdk.operator.api.reconciler.ControllerConfiguration;
import io.javaoperatorsdk.operator.api.reconciler.Reconciler;
import io.javaoperatorsdk.operator.api.reconciler.UpdateControl;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

/**
 * A JOSDK operator whose primary resource is ConfigMap, as JOSDK's docs write one ("Implementing a reconciler",
 * javaoperatorsdk.io/docs/documentation/reconciler): a {@link Reconciler} registered with an {@link Operator} that
 * connects with fabric8's default configuration (KUBECONFIG), the informer restricted by the label selector
 * (annotation) and the namespace (an override at registration). No finalizer: the reconciler does not implement
 * Cleaner, so JOSDK adds none (nothing to clean up).
 *
 * <p>Own writes: from JOSDK 5.3.0 (the version used, 5.3.2) a primary written through {@link UpdateControl} is
 * written through {@code ResourceOperations}, which caches the response and filters the event of the controller's
 * own write, so it triggers no reconciliation ("Read-cache-after-write consistency and event filtering" in the same
 * page; the 5.3 release post). It is on by default, with nothing to turn on.
 */
public final class JosdkOperator {
  private JosdkOperator() {}

  static void run(String namespace, Duration work, Record record) throws InterruptedException {
    Operator operator = new Operator();
    operator.register(new HandledReconciler(work, record), o -> o.settingNamespace(namespace));
    Runtime.getRuntime().addShutdownHook(new Thread(operator::stop, "operator-stop"));
    operator.start();
    new CountDownLatch(1).await(); // until killed
  }

  /** The job: if data.value differs from the handled annotation, record, work, write the annotation. */
  @ControllerConfiguration(name = "kopf-bench", informer = @Informer(labelSelector = Record.LABEL + "=true"))
  public static final class HandledReconciler implements Reconciler<ConfigMap> {
    private final Duration work;
    private final Record record;

    HandledReconciler(Duration work, Record record) {
      this.work = work;
      this.record = record;
    }

    @Override
    public UpdateControl<ConfigMap> reconcile(ConfigMap cm, Context<ConfigMap> context) throws InterruptedException {
      String name = cm.getMetadata().getName();
      String value = cm.getData() == null ? null : cm.getData().get("value");
      Map<String, String> annotations = cm.getMetadata().getAnnotations();
      String handle = Record.unhandled(value, annotations == null ? null : annotations.get(Record.HANDLED));
      record.pass(name, value, handle != null);
      if (handle == null) {
        return UpdateControl.noUpdate();
      }
      record.execution(name, handle, "");
      Thread.sleep(work.toMillis());
      // The primary is written the way the docs recommend ("Using UpdateControl and DeleteControl", same page):
      // returned in UpdateControl, which from v5 patches it with Server Side Apply by default
      // (ConfigurationService.useSSAToPatchPrimaryResource), the resource built from scratch with only the fields
      // that identify it and those the controller owns, a "fully specified intent" (the docs' patchresourcewithssa
      // sample). UpdateControl.patchResource: the annotation is not status.
      ConfigMap intent = new ConfigMapBuilder()
          .withNewMetadata()
          .withName(name)
          .withNamespace(cm.getMetadata().getNamespace())
          .addToAnnotations(Record.HANDLED, handle)
          .endMetadata()
          .build();
      return UpdateControl.patchResource(intent);
    }
  }
}
