package lockgate.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/** The (empty) list of dynamic config properties that Apicurio's config-index extension would build. */
@ApplicationScoped
public class DynamicConfigList {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList list() {
        return new DynamicConfigPropertyList(java.util.List.of());
    }
}
