//! Reads and writes of Kubernetes objects: the generated `ObjectsService` calls, with the same requests
//! and responses, recording what each write returned for the own-write rule of the client's watches. A
//! call the lost connection cut off fails UNAVAILABLE, whatever the transport called it, as in every SDK.

use std::sync::Arc;

use tonic::{IntoRequest, Response, Status, transport::Channel};

use crate::{
    own_writes::OwnWrites,
    proto::{
        CreateRequest, CreateResponse, DeleteRequest, DeleteResponse, GetRequest, GetResponse, KubeObject, ListRequest,
        ListResponse, PatchRequest, PatchResponse, RecordEventRequest, RecordEventResponse, SetConditionRequest,
        SetConditionResponse, UpdateRequest, UpdateResponse, objects_service_client::ObjectsServiceClient,
    },
    retry::cut_off,
};

/// Reads and writes of Kubernetes objects through the sidecar ([`crate::Client::objects`]).
///
/// The same calls as the generated [`ObjectsServiceClient`], taking the same requests (or a
/// `tonic::Request` of one, with metadata) and answering the same responses, so code written against
/// the generated client keeps working. What it adds: every create, update, patch, delete and condition set that returns
/// an object records, per uid, the largest resourceVersion returned, and the watches of the same
/// [`crate::Client`] (and its clones) check each event against that record when the app takes it (the
/// own-write rule, see [`crate::Client::subscribe`]). Writes made through the generated client itself
/// ([`Objects::into_inner`], or one built on [`crate::Client::channel`]) are not recorded.
///
/// The objects client of a [`crate::WorkItem`] ([`crate::WorkItem::objects`]) also names the item's lease
/// in every write (`reconcile_lease`) that does not name one itself.
///
/// Errors are the daemon's gRPC statuses, as the generated client returns them (an apiserver conflict
/// is ABORTED, 403 PERMISSION_DENIED, 404 NOT_FOUND; a bad field INVALID_ARGUMENT naming it).
#[derive(Debug, Clone)]
pub struct Objects {
    service: ObjectsServiceClient<Channel>,
    writes: Arc<OwnWrites>,
    lease: String,
}

impl Objects {
    pub(crate) fn new(channel: Channel, writes: Arc<OwnWrites>) -> Self {
        let service = ObjectsServiceClient::new(channel).max_decoding_message_size(crate::MAX_ANSWER);
        Self { service, writes, lease: String::new() }
    }

    /// The same client, naming `lease` in every write that names none.
    pub(crate) fn for_lease(mut self, lease: &str) -> Self {
        lease.clone_into(&mut self.lease);
        self
    }

    /// The lease this client's writes name (a [`crate::WorkItem`]'s), if any.
    pub fn lease(&self) -> Option<&str> {
        (!self.lease.is_empty()).then_some(self.lease.as_str())
    }

    /// The generated client underneath; writes made through it are not recorded for the own-write rule.
    pub fn into_inner(self) -> ObjectsServiceClient<Channel> {
        self.service
    }

    /// One object, from the watch hub's cache when a watch covers it, else from the apiserver.
    pub async fn get(&mut self, request: impl IntoRequest<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.service.get(request).await.map_err(cut_off)
    }

    /// The objects matching a query.
    pub async fn list(&mut self, request: impl IntoRequest<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.service.list(request).await.map_err(cut_off)
    }

    /// Creates an object and records the version created.
    pub async fn create(
        &mut self,
        request: impl IntoRequest<CreateRequest>,
    ) -> Result<Response<CreateResponse>, Status> {
        let mut request = request.into_request();
        name_lease(&mut request.get_mut().reconcile_lease, &self.lease);
        let response = self.service.create(request).await.map_err(cut_off)?;
        self.record(response.get_ref().object.as_ref());
        Ok(response)
    }

    /// Replaces an object (or its status) and records the version stored.
    pub async fn update(
        &mut self,
        request: impl IntoRequest<UpdateRequest>,
    ) -> Result<Response<UpdateResponse>, Status> {
        let mut request = request.into_request();
        name_lease(&mut request.get_mut().reconcile_lease, &self.lease);
        let response = self.service.update(request).await.map_err(cut_off)?;
        self.record(response.get_ref().object.as_ref());
        Ok(response)
    }

    /// Patches an object (or its status) and records the version stored.
    pub async fn patch(&mut self, request: impl IntoRequest<PatchRequest>) -> Result<Response<PatchResponse>, Status> {
        let mut request = request.into_request();
        name_lease(&mut request.get_mut().reconcile_lease, &self.lease);
        let response = self.service.patch(request).await.map_err(cut_off)?;
        self.record(response.get_ref().object.as_ref());
        Ok(response)
    }

    /// Deletes an object and records the last state when the apiserver returned it.
    pub async fn delete(
        &mut self,
        request: impl IntoRequest<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let mut request = request.into_request();
        name_lease(&mut request.get_mut().reconcile_lease, &self.lease);
        let response = self.service.delete(request).await.map_err(cut_off)?;
        self.record(response.get_ref().object.as_ref());
        Ok(response)
    }

    /// Sets one condition of an object's status.conditions, as apimachinery's `meta.SetStatusCondition` does,
    /// in the daemon: written (server-side apply to the status subresource, under the field manager
    /// `<field_manager>/<type>`) only when it changes, its lastTransitionTime kept while its status stays
    /// (see `SetConditionRequest`). A write is recorded; an answer that wrote nothing is not.
    /// [`crate::WorkItem::set_condition`] fills the request in for an item's primary.
    pub async fn set_condition(
        &mut self,
        request: impl IntoRequest<SetConditionRequest>,
    ) -> Result<Response<SetConditionResponse>, Status> {
        let mut request = request.into_request();
        name_lease(&mut request.get_mut().reconcile_lease, &self.lease);
        let response = self.service.set_condition(request).await.map_err(cut_off)?;
        if response.get_ref().changed {
            self.record(response.get_ref().object.as_ref());
        }
        Ok(response)
    }

    /// Records an event (events.k8s.io/v1) about an object, correlated in the daemon for every app of the pod
    /// as client-go does (see `RecordEventRequest`): `recorded` is false when the rate limit of the reporting
    /// controller's events about that object dropped it. [`crate::WorkItem::record_event`] fills the request
    /// in for an item's primary.
    pub async fn record_event(
        &mut self,
        request: impl IntoRequest<RecordEventRequest>,
    ) -> Result<Response<RecordEventResponse>, Status> {
        self.service.record_event(request).await.map_err(cut_off)
    }

    fn record(&self, object: Option<&KubeObject>) {
        if let Some(object) = object {
            self.writes.record(object);
        }
    }
}

/// Names `lease` in a write that names none.
fn name_lease(field: &mut String, lease: &str) {
    if field.is_empty() {
        lease.clone_into(field);
    }
}
