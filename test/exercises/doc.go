// Package exercises holds runnable exercises B and D of seed 002 ("Abuse
// Prevention, Rate Limiting, and Quotas", section 11), measured against the
// real data plane in one process: the gateway (internal/gateway) with its
// registry (internal/registry) in front of the provider simulator
// (internal/providersim), all on 127.0.0.1 and on the real clock.
//
//   - Exercise B (TestExerciseB): two tenants under the same request-count
//     plan consume wildly different resources (seed 002 section 1: the 693x
//     case); the same two tenants under a token + concurrency + KV-block plan
//     consume about the same.
//   - Exercise D (TestExerciseD): a client that paces itself from the
//     gateway's quota headers (seed 002 section 8) receives far fewer 429s
//     than a naive client doing the same work.
//
// The exercises are tests only; run them with
//
//	go test -v -count=1 -run Exercise ./test/exercises/
//
// docs/exercises.md explains them and holds a measured run.
package exercises
