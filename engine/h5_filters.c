/* engine/h5_filters.h */
#include "engine/h5_filters.h"

#include <stdio.h>

int h5_missing_filter(hid_t dset, char *name, size_t n) {
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return 0;
    int missing = 0, filters = H5Pget_nfilters(dcpl);
    for (int i = 0; i < filters && !missing; i++) {
        unsigned int flags = 0, config = 0;
        size_t n_values = 0;
        char fname[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_values, NULL,
                                         sizeof fname, fname, &config);
        /* "optional" (h5py's lzf is) lets a write skip the filter, not a read: the chunks
         * it did filter need it */
        if (id >= 0 && H5Zfilter_avail(id) <= 0) {
            snprintf(name, n, "%s (id %d)", fname[0] ? fname : "unnamed filter", (int)id);
            missing = 1;
        }
    }
    H5Pclose(dcpl);
    return missing;
}
