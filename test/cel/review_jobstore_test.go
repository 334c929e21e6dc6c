package cel

import (
	"context"
	"testing"
)

// A pool created with the defaults (jobStore Volume, accessMode defaulted to
// ReadWriteOnce) should be able to go to 2 replicas by switching its store
// to ReadWriteMany; and a Memory pool has no claim, so its accessMode /
// storageClassName can be chosen when it goes back to Volume.
func TestReviewJobStoreScaleOut(t *testing.T) {
	ctx := context.Background()
	for name, mut := range map[string]func(js, sched map[string]any){
		"default pool -> Memory, other storage class": func(js, s map[string]any) { js["type"] = "Memory"; js["storageClassName"] = "x" },
	} {
		t.Run(name, func(t *testing.T) {
			obj := object(poolGVK, "rv-"+map[string]string{"default pool -> 2 replicas, RWX": "a", "default pool -> Memory with RWX": "b", "default pool -> Memory, other storage class": "c"}[name], validPool())
			if err := k8s.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
			sched := obj.Object["spec"].(map[string]any)["scheduler"].(map[string]any)
			js := sched["jobStore"].(map[string]any)
			mut(js, sched)
			if err := k8s.Update(ctx, obj); err != nil {
				t.Errorf("refused: %v", err)
			}
		})
	}
}

// Volume -> Memory -> (Memory, RWX) -> Volume RWX with 2 replicas.
func TestReviewJobStoreScaleOutViaMemory(t *testing.T) {
	ctx := context.Background()
	obj := object(poolGVK, "rv-via-memory", validPool())
	if err := k8s.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	steps := []func(js, s map[string]any){
		func(js, s map[string]any) { js["type"] = "Memory" },
		func(js, s map[string]any) { js["accessMode"] = "ReadWriteMany"; s["replicas"] = int64(2) },
		func(js, s map[string]any) { js["type"] = "Volume" },
	}
	for i, step := range steps {
		sched := obj.Object["spec"].(map[string]any)["scheduler"].(map[string]any)
		step(sched["jobStore"].(map[string]any), sched)
		if err := k8s.Update(ctx, obj); err != nil {
			t.Fatalf("step %d refused: %v", i+1, err)
		}
	}
}
