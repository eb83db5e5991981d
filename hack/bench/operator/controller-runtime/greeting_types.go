// The Greeting custom resource of examples/crd.yaml as a Go type, with the deep copies controller-gen would
// generate written out by hand.

package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the Greeting's API group and version.
	GroupVersion = schema.GroupVersion{Group: "example.consistd.io", Version: "v1"}
	// SchemeBuilder adds the Greeting's types to a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
)

func init() {
	SchemeBuilder.Register(&Greeting{}, &GreetingList{})
}

// GreetingSpec is what a Greeting asks for: the message its ConfigMap is to hold.
type GreetingSpec struct {
	Message string `json:"message"`
}

// GreetingStatus is what the operator says about a Greeting: its Ready condition.
type GreetingStatus struct {
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Greeting holds a message; the operator publishes it in a ConfigMap of the same name that the Greeting owns.
type Greeting struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GreetingSpec   `json:"spec"`
	Status GreetingStatus `json:"status,omitempty"`
}

// GreetingList is a list of Greetings.
type GreetingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Greeting `json:"items"`
}

// DeepCopyInto copies the Greeting into out.
func (in *Greeting) DeepCopyInto(out *Greeting) {
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopyObject is a deep copy of the Greeting, as a runtime.Object.
func (in *Greeting) DeepCopyObject() runtime.Object {
	out := new(Greeting)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a deep copy of the list, as a runtime.Object.
func (in *GreetingList) DeepCopyObject() runtime.Object {
	out := new(GreetingList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Greeting, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
