/* ids: the fork server's host id allocator (one per live sandbox, round
 * robin, never two at once) and the start-up check against the host's user
 * database. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox/ids.h"
#include "tap.h"

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void remove_file(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

int main(void)
{
    struct sbx_ids *ids;
    uint32_t got[8], id;
    is_int(ids_new(5000, 8, &ids), 0, "a range of 8");

    bool distinct = true, inside = true;
    for (int i = 0; i < 8; i++) {
        if (ids_take(ids, &got[i]) != 0)
            inside = false;
        inside = inside && got[i] >= 5000 && got[i] < 5008;
        for (int j = 0; j < i; j++)
            distinct = distinct && got[i] != got[j];
    }
    ok(inside && distinct, "8 takes: 8 different ids, all in the range");
    is_int(ids_live(ids), 8, "8 live");
    is_int(ids_take(ids, &id), -EAGAIN, "a 9th: -EAGAIN (every id is live)");
    for (int i = 1; i < 8; i++)
        ok(got[i] == 5000 + (got[0] - 5000 + (uint32_t)i) % 8, "round robin: take %d is %u", i,
           got[i]);

    /* Give back three; they come back in range order after the last take,
     * not the most recently freed one first. */
    ids_put(ids, got[2]);
    ids_put(ids, got[5]);
    ids_put(ids, got[3]);
    is_int(ids_live(ids), 5, "5 live after 3 puts");
    ids_put(ids, got[3]);
    ids_put(ids, 4999);
    ids_put(ids, 5008);
    is_int(ids_live(ids), 5, "putting an id twice or one outside the range changes nothing");
    uint32_t a, b, c;
    ok(ids_take(ids, &a) == 0 && ids_take(ids, &b) == 0 && ids_take(ids, &c) == 0 &&
           a == got[2] && b == got[3] && c == got[5],
       "freed ids come back in turn from the cursor on: %u %u %u", a, b, c);
    ids_free(ids);

    /* A just-freed id waits for every other free one. */
    is_int(ids_new(70000, 100, &ids), 0, "a range of 100");
    uint32_t first;
    ids_take(ids, &first);
    ids_put(ids, first);
    int again = -1;
    for (int i = 1; i <= 100; i++) {
        ids_take(ids, &id);
        ids_put(ids, id);
        if (id == first) {
            again = i;
            break;
        }
    }
    is_int(again, 100, "with nothing else live, a freed id comes back after 99 others");
    ids_free(ids);

    /* Whole-word skipping over a full stretch. */
    is_int(ids_new(100000, 300, &ids), 0, "a range of 300");
    uint32_t all[300];
    for (int i = 0; i < 300; i++)
        ids_take(ids, &all[i]);
    ids_put(ids, all[299]);
    ok(ids_take(ids, &id) == 0 && id == all[299], "the one free id among 300 is found");
    ids_free(ids);
    ok(ids_new(1, 0, &ids) == -EINVAL && ids_new(4294967000u, 1000, &ids) == -EINVAL,
       "empty ranges and ranges past 2^32 are refused");

    /* The host's user database. */
    char dir[] = "/tmp/fbtest-ids-XXXXXX";
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    char err[512] = "";
    is_int(ids_check_host(dir, 2000000, 1000, err, sizeof err), 0, "no files: fine");
    write_text(dir, "passwd",
               "root:x:0:0:root:/root:/bin/bash\n"
               "# a comment:x:2000100:1\n"
               "odd line\n"
               "alice:x:1000:1000::/home/alice:/bin/sh\n");
    write_text(dir, "group", "root:x:0:\nstaff:x:50:\n");
    write_text(dir, "subuid", "alice:100000:65536\n");
    is_int(ids_check_host(dir, 2000000, 1000, err, sizeof err), 0, "a range nobody uses: fine");
    ok(ids_check_host(dir, 999, 2, err, sizeof err) == -EEXIST && strstr(err, "/passwd:4") &&
           strstr(err, "id 1000"),
       "a passwd uid inside is refused (%s)", err);
    ok(ids_check_host(dir, 40, 20, err, sizeof err) == -EEXIST && strstr(err, "/group:2"),
       "a group gid inside is refused (%s)", err);
    ok(ids_check_host(dir, 165000, 10, err, sizeof err) == -EEXIST && strstr(err, "/subuid:1"),
       "a range overlapping subordinate ids is refused (%s)", err);
    is_int(ids_check_host(dir, 165536, 10, err, sizeof err), 0,
           "the first id after the subordinate range is fine");
    write_text(dir, "subgid", "bob:90000:10001\n");
    ok(ids_check_host(dir, 95000, 5, err, sizeof err) == -EEXIST && strstr(err, "/subgid:1"),
       "subgid too (%s)", err);
    remove_file(dir, "passwd");
    remove_file(dir, "group");
    remove_file(dir, "subuid");
    remove_file(dir, "subgid");
    rmdir(dir);
    return tap_done();
}
