/*
 * sd_optim: the C side of tests/interop/test_optim_kinds.py, through the
 * generic optimizer description of <dcp/dcp_statedict.h> only (one
 * process, the whole flat space bound).
 *
 * Usage:
 *   sd_optim load SPEC DIR OUTDIR
 *       Describes the model and optimizer of SPEC (dcp_sd_optim_preset with
 *       the spec's overrides), dcp_sd_load's DIR strictly (hyper-parameters
 *       must equal the description's), and writes OUTDIR/model.bin, one
 *       OUTDIR/<state tensor>.bin each (its flat space: dcp_sd_state_numel
 *       float32s), and
 *       OUTDIR/scalars.txt ("step N", then "NAME I HEXFLOAT" per scalar
 *       and parameter), OUTDIR/groups.json (one JSON dict a line).
 *   sd_optim save SPEC INDIR DIR
 *       The same description, its buffers read from INDIR (the files load
 *       writes), dcp_save'd to DIR.
 *
 * SPEC, one record a line:
 *   kind K          a dcp_optim_kind
 *   variant V       dcp_optim_variant bits
 *   flat F          1: DCP_SD_FLAT
 *   groups N        N groups, each the preset's defaults
 *   hp G NAME T V   group G's NAME set: T f (V a C hex float), i (an int),
 *                   b (0/1), n (None; no V), p (V "HEX,HEX": a pair)
 *   param FQN G FROZEN NDIM D0 D1 ...
 *
 * Exit 0 on success; otherwise a message on stderr and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dcp/dcp.h>
#include <dcp/dcp_statedict.h>

static void die(const char *what, int rc, const dcp_ctx *ctx)
{
    fprintf(stderr, "sd_optim: %s failed (%d): %s\n", what, rc,
            ctx ? dcp_errmsg(ctx) : "");
    exit(1);
}

struct spec {
    int kind, flat;
    unsigned variant;
    size_t ngroups;
    dcp_value **g;
    dcp_sd_optim layout;
};

static dcp_value *hex_float(const char *s)
{
    return dcp_value_float(strtod(s, NULL));
}

static dcp_sd *build(const char *path, struct spec *sp)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    dcp_sd *sd = NULL;
    size_t k;
    int rc;
    if (!f)
        die("open spec", -1, NULL);
    memset(sp, 0, sizeof(*sp));
    while (fgets(line, sizeof(line), f)) {
        char *tok = strtok(line, " \n");
        if (!tok)
            continue;
        if (!strcmp(tok, "kind")) {
            sp->kind = atoi(strtok(NULL, " \n"));
        } else if (!strcmp(tok, "variant")) {
            sp->variant = (unsigned)atoi(strtok(NULL, " \n"));
        } else if (!strcmp(tok, "flat")) {
            sp->flat = atoi(strtok(NULL, " \n"));
        } else if (!strcmp(tok, "groups")) {
            sp->ngroups = (size_t)atoi(strtok(NULL, " \n"));
            sp->g = calloc(sp->ngroups, sizeof(*sp->g));
            for (k = 0; k < sp->ngroups; k++) {
                rc = dcp_sd_optim_preset((dcp_optim_kind)sp->kind, sp->variant,
                                         &sp->layout, &sp->g[k]);
                if (rc != DCP_OK)
                    die("dcp_sd_optim_preset", rc, NULL);
            }
            if (sp->flat)
                sp->layout.flags |= DCP_SD_FLAT;
            rc = dcp_sd_create_optim(&sd, DCP_F32, &sp->layout);
            if (rc != DCP_OK)
                die("dcp_sd_create_optim", rc, NULL);
        } else if (!strcmp(tok, "hp")) {
            size_t g = (size_t)atoi(strtok(NULL, " \n"));
            const char *name = strtok(NULL, " \n");
            const char *t = strtok(NULL, " \n");
            const char *v = strtok(NULL, " \n");
            dcp_value *val = NULL;
            if (*t == 'f')
                val = hex_float(v);
            else if (*t == 'i')
                val = dcp_value_int(strtoll(v, NULL, 10));
            else if (*t == 'b')
                val = dcp_value_bool(atoi(v));
            else if (*t == 'n')
                val = dcp_value_none();
            else if (*t == 'p') {
                char *comma = strchr(v, ',');
                val = dcp_value_tuple();
                *comma = '\0';
                dcp_value_append(val, hex_float(v));
                dcp_value_append(val, hex_float(comma + 1));
            }
            rc = dcp_value_dict_set(sp->g[g], name, val);
            if (rc != DCP_OK)
                die("dcp_value_dict_set", rc, NULL);
        } else if (!strcmp(tok, "param")) {
            const char *fqn = strtok(NULL, " \n");
            size_t g = (size_t)atoi(strtok(NULL, " \n"));
            int frozen = atoi(strtok(NULL, " \n"));
            int ndim = atoi(strtok(NULL, " \n")), d;
            int64_t shape[DCP_MAX_NDIM];
            for (d = 0; d < ndim; d++)
                shape[d] = strtoll(strtok(NULL, " \n"), NULL, 10);
            /* Groups are added once, at the first parameter. */
            while (dcp_sd_group_count(sd) < sp->ngroups) {
                rc = dcp_sd_add_group_values(sd,
                                             sp->g[dcp_sd_group_count(sd)]);
                if (rc != DCP_OK)
                    die("dcp_sd_add_group_values", rc, NULL);
            }
            rc = dcp_sd_add_param(sd, g, fqn, ndim, shape);
            if (rc == DCP_OK && frozen)
                rc = dcp_sd_set_param_frozen(sd, dcp_sd_param_count(sd) - 1, 1);
            if (rc != DCP_OK)
                die("dcp_sd_add_param", rc, NULL);
        }
    }
    fclose(f);
    if (!sd)
        die("spec without groups", -1, NULL);
    return sd;
}

static void file_io(const char *dir, const char *name, void *buf, size_t n,
                    int write)
{
    char path[4096];
    FILE *f;
    (void)snprintf(path, sizeof(path), "%s/%s.bin", dir, name);
    f = fopen(path, write ? "wb" : "rb");
    if (!f || (write ? fwrite(buf, 4, n, f) : fread(buf, 4, n, f)) != n)
        die(path, -1, NULL);
    fclose(f);
}

int main(int argc, char **argv)
{
    struct spec sp;
    dcp_sd *sd;
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    void *bufs[DCP_SD_OPTIM_MAX_STATE];
    float *model;
    size_t n, k, i, tn[DCP_SD_OPTIM_MAX_STATE];
    int save, rc;
    char path[4096];
    FILE *f;
    if (argc != 5 || (strcmp(argv[1], "load") && strcmp(argv[1], "save"))) {
        fprintf(stderr, "usage: sd_optim load|save SPEC DIR1 DIR2\n");
        return 2;
    }
    save = !strcmp(argv[1], "save");
    sd = build(argv[2], &sp);
    n = (size_t)dcp_sd_numel(sd);
    model = calloc(n ? n : 1, 4);
    for (k = 0; k < sp.layout.ntensors; k++) {
        tn[k] = (size_t)dcp_sd_state_numel(sd, k);
        bufs[k] = calloc(tn[k] ? tn[k] : 1, 4);
    }
    if (save) {
        char name[64];
        long long step = 0;
        float v;
        file_io(argv[3], "model", model, n, 0);
        for (k = 0; k < sp.layout.ntensors; k++)
            file_io(argv[3], sp.layout.tensors[k], bufs[k], tn[k], 0);
        (void)snprintf(path, sizeof(path), "%s/scalars.txt", argv[3]);
        f = fopen(path, "r");
        if (!f || fscanf(f, " step %lld", &step) != 1)
            die(path, -1, NULL);
        rc = dcp_sd_set_step(sd, step);
        while (rc == DCP_OK && fscanf(f, " %63s %zu %a", name, &i, &v) == 3)
            rc = dcp_sd_set_scalar(sd, name, i, v);
        fclose(f);
        if (rc != DCP_OK)
            die("dcp_sd_set_step / set_scalar", rc, NULL);
    }
    rc = dcp_sd_bind_model(sd, 0, (int64_t)n, model);
    if (rc == DCP_OK)
        rc = dcp_sd_bind_state(sd, 0, (int64_t)n, bufs);
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = dcp_sd_add_to_state(sd, st, "model", "optim");
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc != DCP_OK)
        die("describe", rc, ctx);
    if (save) {
        rc = dcp_save(ctx, st, argv[4], NULL);
        if (rc != DCP_OK)
            die("dcp_save", rc, ctx);
    } else {
        rc = dcp_sd_load(ctx, sd, st, argv[3], NULL, 0);
        if (rc != DCP_OK)
            die("dcp_sd_load", rc, ctx);
        file_io(argv[4], "model", model, n, 1);
        for (k = 0; k < sp.layout.ntensors; k++)
            file_io(argv[4], sp.layout.tensors[k], bufs[k], tn[k], 1);
        (void)snprintf(path, sizeof(path), "%s/scalars.txt", argv[4]);
        f = fopen(path, "w");
        fprintf(f, "step %lld\n", (long long)dcp_sd_step(sd));
        for (k = 0; k < sp.layout.nscalars; k++) {
            for (i = 0; i < dcp_sd_param_count(sd); i++) {
                float v;
                (void)dcp_sd_scalar(sd, sp.layout.scalars[k], i, &v);
                fprintf(f, "%s %zu %a\n", sp.layout.scalars[k], i, (double)v);
            }
        }
        fclose(f);
        (void)snprintf(path, sizeof(path), "%s/groups.json", argv[4]);
        f = fopen(path, "w");
        for (k = 0; k < dcp_sd_group_count(sd); k++) {
            char *js = NULL;
            rc = dcp_value_to_json(dcp_sd_group_values(sd, k), &js);
            if (rc != DCP_OK)
                die("dcp_value_to_json", rc, NULL);
            fprintf(f, "%s\n", js);
            dcp_free(js);
        }
        fclose(f);
    }
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    dcp_sd_free(sd);
    for (k = 0; k < sp.ngroups; k++)
        dcp_value_free(sp.g[k]);
    free(sp.g);
    for (k = 0; k < sp.layout.ntensors; k++)
        free(bufs[k]);
    free(model);
    return 0;
}
