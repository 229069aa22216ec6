// A small cronhook client as a TypeScript user writes it: openapi-fetch over the types that
// openapi-typescript generates from openapi/openapi.json (./cronhook.d.ts, not committed). It is
// never run, only type-checked: tests/unit/test_typescript_contract.py generates the types and
// runs `tsc -p` (strict) on a copy of this directory. Every call and every field read here is
// one a user relies on, so a contract change that breaks such a client fails the check. The
// `@ts-expect-error` lines must NOT type-check: they prove the check is really checking.
//
// Bodies and queries written inline in a call are checked for missing fields and wrong types,
// not for unknown ones: openapi-fetch infers the options it is given, and TypeScript flags an
// excess property only against a declared type (openapi-ts/openapi-typescript#1769). So those
// whose field names matter here carry `satisfies` (or a declared type): a field renamed or
// removed in the contract then fails too, as every request schema is closed
// (additionalProperties: false). To edit this file with the types at hand, generate them:
//   node_modules/.bin/openapi-typescript ../../openapi/openapi.json -o cronhook.d.ts
import createClient from "openapi-fetch";
import type { components, paths } from "./cronhook";

type Schemas = components["schemas"];
type Problem = Schemas["Problem"];
type JobState = Schemas["JobState"];

// A is B (each assignable to the other) and not `any`, which a plain annotation would accept.
// Structural: openapi-fetch hands out the schema's types re-mapped (Readable<>), not the same alias.
type Same<A, B> = 0 extends 1 & A ? false : [A] extends [B] ? ([B] extends [A] ? true : false) : false;
function assertType<A, B>(_proof: Same<A, B>): void {}

export function connect(baseUrl: string, key: string) {
  return createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${key}` } });
}
type Cronhook = ReturnType<typeof connect>;

// One line per problem: its title and detail, then each offending field (422).
export function describe(problem: Problem): string {
  const fields = (problem.errors ?? []).map((e) => `${e.field}: ${e.message}`);
  return [`${problem.status} ${problem.title}: ${problem.detail}`, ...fields].join("\n  ");
}

// A target with only its required fields; its secret is shown once.
export async function createTarget(cronhook: Cronhook, url: string) {
  const { data, error } = await cronhook.POST("/v1/targets", { body: { name: "billing", url } });
  if (error) throw new Error(describe(error));
  const secret: string = data.secret;
  return { id: data.id, secret };
}

// A one-off job: nothing but target_id is required of the body. A field the server fills in
// (priority, max_attempts...) must stay optional: a request field with a `default` in the
// contract would be required by openapi-typescript and fail here. The server itself asks for
// a schedule (run_at, delay_s, cron or every_s), so the call sends one.
export async function remindLater(cronhook: Cronhook, target_id: string, run_at: string) {
  const bare = { target_id } satisfies Schemas["JobCreate"];
  const { data, error } = await cronhook.POST("/v1/jobs", { body: { ...bare, run_at } satisfies Schemas["JobCreate"] });
  if (error) throw new Error(describe(error));
  const due: string | null = data.next_run_at;
  return { id: data.id, due };
}

// A cron job in a time zone, once per dedup_key: a second create is a 409 naming the job
// that holds the key (`job_id`); other refusals are read by status.
export async function scheduleNightly(cronhook: Cronhook, target_id: string) {
  const { data, error, response } = await cronhook.POST("/v1/jobs", {
    body: {
      target_id,
      cron: "30 2 * * *",
      timezone: "Europe/Paris",
      dedup_key: "nightly-report",
      payload: { report: "daily" },
    } satisfies Schemas["JobCreate"],
    headers: { "Idempotency-Key": crypto.randomUUID() },
  });
  if (error) {
    assertType<typeof error, Problem>(true);
    if (error.status === 409 && error.job_id !== undefined) {
      const holder: string = error.job_id;
      return { id: holder, created: false };
    }
    if (error.status === 422) {
      const fields: string[] = (error.errors ?? []).map((e) => e.field);
      throw new Error(`invalid: ${fields.join(", ")}`);
    }
    if (error.status === 429) {
      const title: string = error.title;
      throw new Error(`${title}; retry in ${response.headers.get("Retry-After") ?? "?"} s`);
    }
    throw new Error(describe(error));
  }
  return { id: data.id, created: true };
}

// Cancelling a finished job is a 409 naming the state it is in.
export async function cancel(cronhook: Cronhook, job_id: string): Promise<JobState> {
  const { data, error } = await cronhook.POST("/v1/jobs/{job_id}/cancel", { params: { path: { job_id } } });
  if (error) {
    if (error.status === 409 && error.state !== undefined) {
      const state: JobState = error.state;
      if (state === "succeeded" || state === "dead" || state === "cancelled") return state;
    }
    throw new Error(describe(error));
  }
  return data.state;
}

// Every job in a state, page by page (`next_cursor` is null on the last page).
// (The query is declared with the generated type: a cursor read from the previous answer and
// passed to the next request would make TypeScript's inference circular, TS7022.)
type JobsQuery = NonNullable<paths["/v1/jobs"]["get"]["parameters"]["query"]>;
export async function* jobsIn(cronhook: Cronhook, state: JobState) {
  const query: JobsQuery = { state, limit: 200 };
  for (;;) {
    const { data, error } = await cronhook.GET("/v1/jobs", { params: { query } });
    if (error) throw new Error(describe(error));
    yield* data.items;
    const next: string | null = data.next_cursor;
    if (next === null) return;
    query.cursor = next;
  }
}

// A job's latest runs, newest first.
type RunsQuery = NonNullable<paths["/v1/jobs/{job_id}/runs"]["get"]["parameters"]["query"]>;
export async function latestRuns(cronhook: Cronhook, job_id: string) {
  const query = { order: "desc", limit: 20 } satisfies RunsQuery;
  const { data, error } = await cronhook.GET("/v1/jobs/{job_id}/runs", { params: { path: { job_id }, query } });
  if (error) throw new Error(describe(error));
  const next: string | null = data.next_cursor;
  const runs = data.items.map((run) => ({ at: run.scheduled_for, outcome: run.outcome, status: run.status_code }));
  return { runs, next };
}

// Replay every dead letter: the body's fields are all optional.
export async function replayAll(cronhook: Cronhook) {
  const { data, error } = await cronhook.POST("/v1/dead-letters/replay", { body: {} });
  if (error) throw new Error(describe(error));
  return data.replayed.map((replayed) => replayed.job_id);
}

// PATCH changes only the fields sent.
export async function retryMore(cronhook: Cronhook, job_id: string) {
  const { data, error } = await cronhook.PATCH("/v1/jobs/{job_id}", {
    params: { path: { job_id } },
    body: { max_attempts: 10 } satisfies Schemas["JobUpdate"],
  });
  if (error) throw new Error(describe(error));
  return data.max_attempts;
}

// An admin-only read with a tenant's key is a 403 problem.
export async function cluster(cronhook: Cronhook) {
  const { data, error } = await cronhook.GET("/v1/cluster");
  if (error?.status === 403) return `not an admin key: ${error.title}`;
  if (error) throw new Error(describe(error));
  return `${data.replicas.length} replicas, ${data.unowned_partitions} partitions unowned`;
}

// The README's snippet ("## The API"), as written there.
export async function readmeSnippet(key: string, target_id: string) {
  const cronhook = createClient<paths>({ baseUrl: "http://127.0.0.1:8080", headers: { Authorization: `Bearer ${key}` } });
  const { data, error } = await cronhook.POST("/v1/jobs", { body: { target_id, cron: "*/5 * * * *", dedup_key: "nightly" } });
  if (error?.status === 409 && error.job_id) console.log("already scheduled as", error.job_id);
  else if (error) console.log(error.title, error.detail, error.errors);
  else console.log("created", data.id, "first run at", data.next_run_at);
}

// What must not type-check.
export async function refused(cronhook: Cronhook, target_id: string) {
  // @ts-expect-error a job needs its target_id
  await cronhook.POST("/v1/jobs", { body: { cron: "0 * * * *" } });
  // @ts-expect-error no such state
  await cronhook.GET("/v1/jobs", { params: { query: { state: "finished" } } });
  // @ts-expect-error runs are ordered `asc` or `desc`
  await cronhook.GET("/v1/jobs/{job_id}/runs", { params: { path: { job_id: target_id }, query: { order: "newest" } } });
  // @ts-expect-error no such field (caught through `satisfies`: see the top of the file)
  await cronhook.POST("/v1/dead-letters/replay", { body: { dry_run: true } satisfies Schemas["DeadLetterBulkReplay"] });
  const { error } = await cronhook.POST("/v1/jobs/{job_id}/cancel", { params: { path: { job_id: target_id } } });
  // @ts-expect-error a problem's state is a JobState, not any string
  if (error?.state === "finished") return;
}
