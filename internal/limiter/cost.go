package limiter

// Default cost model weights (brief "cost model"; seed 002 section 3: an
// output token costs about four input tokens).
const (
	DefaultInputWeight   int64 = 1
	DefaultOutputWeight  int64 = 4
	DefaultKVBlockTokens int64 = 16
)

// maxTokens bounds every token count fed to the cost model (2^40, about 10^12
// tokens) so that weighted products cannot overflow int64.
const maxTokens int64 = 1 << 40

// maxWeight bounds every weight (2^20) for the same reason.
const maxWeight int64 = 1 << 20

// CostModel converts provider tokens into weighted tokens and KV blocks. It
// mirrors the ProviderPool's spec.costModel: InputWeight and OutputWeight are
// the weights of one prompt and one generated token (>= 1; a value < 1 means
// the default, 1 and 4), KVBlockTokens the size of one KV-cache block in
// tokens (>= 1; default 16).
type CostModel struct {
	InputWeight, OutputWeight, KVBlockTokens int64
}

// DefaultCostModel is the cost model with the default weights 1, 4 and block
// size 16.
var DefaultCostModel = CostModel{DefaultInputWeight, DefaultOutputWeight, DefaultKVBlockTokens}

// Normalized returns m with every field < 1 replaced by its default and every
// weight capped at 2^20.
func (m CostModel) Normalized() CostModel {
	if m.InputWeight < 1 {
		m.InputWeight = DefaultInputWeight
	}
	if m.OutputWeight < 1 {
		m.OutputWeight = DefaultOutputWeight
	}
	if m.KVBlockTokens < 1 {
		m.KVBlockTokens = DefaultKVBlockTokens
	}
	m.InputWeight = min(m.InputWeight, maxWeight)
	m.OutputWeight = min(m.OutputWeight, maxWeight)
	return m
}

// clampTokens limits a token count to [0, 2^40].
func clampTokens(n int64) int64 {
	return max(0, min(n, maxTokens))
}

// Cost is the up-front charge of one request (brief "cost model"):
//
//   - PromptTokens, MaxOutputTokens: provider tokens of the prompt and the
//     output limit (the largest recognised max-output field, BC-28).
//   - Weighted: PromptTokens*InputWeight + MaxOutputTokens*OutputWeight, in
//     weighted tokens; the unit of the tenant token bucket, budgets and the
//     fair queue.
//   - ProviderTokens: PromptTokens + MaxOutputTokens, what the provider counts
//     against the account.
//   - KVBlocks: ceil(ProviderTokens / KVBlockTokens), the KV-cache blocks the
//     request may hold.
//   - InputWeight, OutputWeight: the weights Weighted was computed with, kept so
//     that the refund at completion uses the same model as the charge (BC-23).
//
// Build Costs with CostModel.Cost; a hand-built Cost with zero weights settles
// with the default weights.
type Cost struct {
	PromptTokens, MaxOutputTokens, Weighted, ProviderTokens, KVBlocks int64
	InputWeight, OutputWeight                                         int64
}

// Cost returns the up-front charge of a request with promptTokens prompt tokens
// and a limit of maxOutputTokens output tokens, filling every field of Cost.
// Negative counts are treated as 0 and counts above 2^40 as 2^40.
func (m CostModel) Cost(promptTokens, maxOutputTokens int64) Cost {
	m = m.Normalized()
	p, o := clampTokens(promptTokens), clampTokens(maxOutputTokens)
	return Cost{
		PromptTokens:    p,
		MaxOutputTokens: o,
		Weighted:        p*m.InputWeight + o*m.OutputWeight,
		ProviderTokens:  p + o,
		KVBlocks:        (p + o + m.KVBlockTokens - 1) / m.KVBlockTokens,
		InputWeight:     m.InputWeight,
		OutputWeight:    m.OutputWeight,
	}
}

// Weighted returns promptTokens*InputWeight + outputTokens*OutputWeight, in
// weighted tokens: the actual cost of a completed request from its usage.
// Negative counts are treated as 0.
func (m CostModel) Weighted(promptTokens, outputTokens int64) int64 {
	m = m.Normalized()
	return clampTokens(promptTokens)*m.InputWeight + clampTokens(outputTokens)*m.OutputWeight
}

// model returns the cost model c was computed with.
func (c *Cost) model() CostModel {
	return CostModel{InputWeight: c.InputWeight, OutputWeight: c.OutputWeight}.Normalized()
}

// Usage is what the provider reported for a finished request, in provider
// tokens (the response's usage object, or the streaming usage chunk). Known is
// false when no usage was seen (a stream without a usage chunk, an aborted
// call): the output reservation is then kept and nothing is refunded
// (BC-28(a)).
type Usage struct {
	PromptTokens, OutputTokens int64
	Known                      bool
}

// Valid reports whether u carries usable figures: Known, with no negative
// count. A negative count is a malformed report, not a refund: such usage
// is settled as unknown (the charge stands, BC-28(a)), never clamped to
// zero tokens used.
func (u Usage) Valid() bool { return u.Known && u.PromptTokens >= 0 && u.OutputTokens >= 0 }
