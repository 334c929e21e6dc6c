package gateway

import (
	"net/http"
	"strconv"
)

// modelObject is one model of GET /v1/models and GET /v1/models/{model}
// (OpenAI API reference, "Models: the model object"). Created is 0: the
// pool does not know when the provider published the model.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelList is the answer of GET /v1/models.
type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

// modelOwner is the owned_by of every model the gateway lists: the models
// are those the pool serves (ProviderPool spec.models), not the provider's
// catalogue.
const modelOwner = "fairshare"

// listModels serves GET /v1/models: the pool's models (spec.models, in
// their order) to an identified tenant, answered by the gateway without a
// call to the provider and without a charge, so that OpenAI clients and
// tools that discover models first can use the pool. The errors are
// identify's (401 invalid_api_key / unknown_tenant, 503 not_ready).
func (g *Gateway) listModels(w http.ResponseWriter, r *http.Request) {
	_, pool, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return
	}
	list := modelList{Object: "list", Data: make([]modelObject, len(pool.Models))}
	for i, m := range pool.Models {
		list.Data[i] = modelObject{ID: m.Name, Object: "model", OwnedBy: modelOwner}
	}
	writeJSON(w, http.StatusOK, list)
}

// getModel serves GET /v1/models/{model}: the model object of a model the
// pool serves, else 404 model_not_found (param "model"), as the provider
// answers for a model it does not have. Errors as listModels otherwise.
func (g *Gateway) getModel(w http.ResponseWriter, r *http.Request) {
	_, pool, aerr := g.identify(r)
	if aerr != nil {
		g.refuse(w, nil, aerr)
		return
	}
	name := r.PathValue("model")
	for _, m := range pool.Models {
		if m.Name == name {
			writeJSON(w, http.StatusOK, modelObject{ID: m.Name, Object: "model", OwnedBy: modelOwner})
			return
		}
	}
	e := badParam(codeModelNotFound, "model", "The model "+strconv.Quote(name)+" is not served by this pool.")
	e.status = http.StatusNotFound
	g.refuse(w, nil, e)
}
